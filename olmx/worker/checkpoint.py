"""Checkpoints verified before they are published, and a resume that loads only verified ones.

OLMo-core 3.0.0 saves synchronously into ``stepN-tmp/``, renames it to ``stepN/`` and then
writes ``stepN/.metadata.json``, its mark of a complete checkpoint (``train/checkpoint.py``;
research note olmo-core-3.0.md §3.4). olmx puts a verification between the rename and the mark
(:class:`VerifiedCheckpointer`):

1. every rank reads back its share of the files (sorted, round-robin) and computes their size
   and CRC-32 (``zlib.crc32``, a few GB/s);
2. rank 0 checks the structure: every byte range the torch DCP metadata
   (``model_and_optim/.metadata``) points at lies inside a file that exists, and every rank's
   trainer state ``train/rank<R>.pt`` is there;
3. rank 0 writes ``olmx-manifest.json`` (size and CRC of every file) and only then
   ``.metadata.json``.

A crash anywhere before step 3 leaves ``stepN-tmp/`` or a ``stepN/`` without
``.metadata.json``, which neither OLMo-core nor olmx takes for a checkpoint.

On start, :func:`resume_from_verified` (not OLMo-core's ``maybe_load_checkpoint``, which takes
the newest ``stepN`` on trust) removes such partial checkpoints, re-verifies the newest
complete checkpoint against its manifest (every rank checks a share), renames a corrupt one to
``stepN.corrupt`` and tries the next older one, and loads the first that verifies with
``Trainer.load_checkpoint``. Every removal and fallback is recorded in ``events.jsonl``. Older
checkpoints beyond the checkpointer's ``max_checkpoints`` (3) are then removed: OLMo-core trims
only those its own process saved, so without this they would pile up over restarts.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from olmo_core.train.checkpoint import Checkpointer, CheckpointerConfig

from olmx.events import append_event
from olmx.writable import write_text_atomic

log = logging.getLogger(__name__)

#: Checkpoints OLMo-core's checkpointer keeps (its ``max_checkpoints``, set by olmx.worker.train).
KEEP_CHECKPOINTS = 3
#: olmx's per-checkpoint manifest: ``{"files": {relpath: [size, crc32]}, "world_size": N}``.
MANIFEST = "olmx-manifest.json"
#: OLMo-core's completion mark.
METADATA = Checkpointer.METADATA_FNAME
_CHUNK = 8 << 20


class CheckpointCorrupt(RuntimeError):
    """A checkpoint failed verification (raised at save time; at resume it is moved aside)."""


def _file_digest(path: Path) -> list[int]:
    """``[size, crc32]`` of a file; ``[-1, 0]`` if it cannot be read."""
    crc, size = 0, 0
    try:
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                crc = zlib.crc32(chunk, crc)
                size += len(chunk)
    except OSError:
        return [-1, 0]
    return [size, crc]


def _data_files(ckpt: Path) -> list[str]:
    """Every file of a checkpoint except the completion mark and the manifest, sorted."""
    return sorted(
        str(p.relative_to(ckpt)) for p in ckpt.rglob("*") if p.is_file() and p.name not in (METADATA, MANIFEST)
    )


def _digests(ckpt: Path, files: list[str]) -> dict[str, list[int]]:
    """Size and CRC of ``files``, each rank reading a round-robin share, gathered on all ranks."""
    from olmo_core.distributed.utils import all_gather_object, get_rank, get_world_size

    rank, world = get_rank(), get_world_size()
    mine = {f: _file_digest(ckpt / f) for f in files[rank::world]}
    merged: dict[str, list[int]] = {}
    for part in all_gather_object(mine):
        merged.update(part)
    return merged


def structure_problem(ckpt: Path, sizes: dict[str, int], world_size: int | None) -> str | None:
    """Why ``ckpt`` cannot be loaded, judging by its structure alone (None: it can)."""
    from olmo_core.distributed.checkpoint import get_checkpoint_metadata

    if not (ckpt / "model_and_optim" / ".metadata").is_file():
        return "model_and_optim/.metadata is missing"
    try:
        metadata = get_checkpoint_metadata(str(ckpt / "model_and_optim"))
    except Exception as exc:  # unpicklable, truncated: any failure means it cannot be loaded
        return f"model_and_optim/.metadata is unreadable ({type(exc).__name__}: {exc})"
    for info in (metadata.storage_data or {}).values():
        rel = f"model_and_optim/{info.relative_path}"
        size = sizes.get(rel)
        if size is None or size < 0:
            return f"{rel} is missing"
        if info.offset + info.length > size:
            return f"{rel} is truncated ({size} bytes, the metadata needs {info.offset + info.length})"
    ranks = range(world_size) if world_size else [0]
    for r in ranks:
        if sizes.get(f"train/rank{r}.pt", -1) < 0:
            return f"train/rank{r}.pt is missing"
    return None


def verify(ckpt: Path, *, write_manifest: bool = False) -> str | None:
    """Verify a checkpoint on every rank together (a collective); the problem, or None if good.

    With ``write_manifest`` (at save time) the digests are recorded; otherwise they are compared
    with the recorded manifest (a checkpoint without one, e.g. written by OLMo-core alone, is
    checked by structure only)."""
    from olmo_core.distributed.utils import broadcast_object, get_rank, get_world_size

    rank0 = get_rank() == 0
    manifest: dict[str, Any] | None = None
    files: list[str] = []
    if rank0:
        if not write_manifest and (ckpt / MANIFEST).is_file():
            try:
                manifest = json.loads((ckpt / MANIFEST).read_text())
            except ValueError:
                manifest = {"files": {}, "unreadable": True}
        files = sorted(manifest["files"]) if manifest else _data_files(ckpt)
    manifest, files = broadcast_object((manifest, files))
    digests = _digests(ckpt, files)
    problem = None
    if rank0:
        if manifest is not None:
            if manifest.get("unreadable"):
                problem = f"{MANIFEST} is unreadable"
            for rel, expected in manifest["files"].items():
                got = digests.get(rel, [-1, 0])
                if problem:
                    break
                if got[0] < 0:
                    problem = f"{rel} is missing"
                elif got != list(expected):
                    problem = (
                        f"{rel} does not match its manifest (size {got[0]} vs {expected[0]}, "
                        f"crc {got[1]:08x} vs {expected[1]:08x})"
                    )
        world = manifest.get("world_size") if manifest else (get_world_size() if write_manifest else None)
        problem = problem or structure_problem(ckpt, {k: v[0] for k, v in digests.items()}, world)
        if problem is None and write_manifest:
            write_text_atomic(
                ckpt / MANIFEST, json.dumps({"files": digests, "world_size": get_world_size()}), durable=True
            )
    return broadcast_object(problem)


class VerifiedCheckpointer(Checkpointer):
    """OLMo-core's Checkpointer with a verification before the completion mark (module doc)."""

    def save_async(self, *args: Any, **kwargs: Any) -> Any:
        """Not supported: olmx saves synchronously (async saves deadlock, research note §3.9)."""
        raise NotImplementedError("olmx saves checkpoints synchronously")

    def _save_metadata(self, dir: Any, metadata: Any) -> None:
        from olmo_core.distributed.utils import get_rank

        from olmx.worker.faults import inject

        ckpt = Path(str(dir))
        inject("killsave", _step_of(ckpt))
        problem = verify(ckpt, write_manifest=True)
        if problem is not None:
            raise CheckpointCorrupt(f"checkpoint {ckpt} failed verification after writing: {problem}")
        if get_rank() == 0:
            super()._save_metadata(dir, metadata)


@dataclass
class OlmxCheckpointerConfig(CheckpointerConfig):
    """Builds a :class:`VerifiedCheckpointer` (the Trainer's ``checkpointer`` seam)."""

    def build(self, process_group: Any = None, **kwargs: Any) -> Checkpointer:
        """Same arguments as OLMo-core's ``CheckpointerConfig.build``."""
        kwargs = {**self.as_dict(exclude_none=True, recurse=False), **kwargs}
        return VerifiedCheckpointer(process_group=process_group, **kwargs)


def _step_of(path: Path) -> int:
    m = re.fullmatch(r"step(\d+)", path.name)
    return int(m.group(1)) if m else -1


def checkpoint_dirs(save_folder: Path) -> tuple[list[tuple[int, Path]], list[Path]]:
    """(complete checkpoints newest first, partial ones: ``stepN-tmp`` or no ``.metadata.json``)."""
    complete, partial = [], []
    for p in save_folder.glob("step*") if save_folder.is_dir() else []:
        step = _step_of(p)
        if step >= 0 and (p / METADATA).is_file():
            complete.append((step, p))
        elif step >= 0 or re.fullmatch(r"step\d+-tmp", p.name):
            partial.append(p)
    return sorted(complete, key=lambda sp: -sp[0]), sorted(partial)


def resume_from_verified(trainer: Any, run_dir: str | Path) -> int | None:
    """Clean up partial checkpoints, load the newest checkpoint that verifies; its step (None:
    none, the run starts from its initialisation). Call on every rank, before ``fit``."""
    from olmo_core.distributed.utils import barrier, broadcast_object, get_rank

    save_folder = Path(trainer.save_folder)
    rank0 = get_rank() == 0
    complete, partial = checkpoint_dirs(save_folder)
    complete, partial = broadcast_object((complete, partial))
    if rank0:
        for p in partial:
            log.warning(f"removing partial checkpoint {p} (a save was interrupted)")
            shutil.rmtree(p, ignore_errors=True)
            append_event(run_dir, "checkpoint_partial", path=str(p), action="removed")
    barrier()
    for i, (step, path) in enumerate(complete):
        problem = verify(path)
        if problem is None:
            trainer.load_checkpoint(str(path), load_trainer_state=True, load_optim_state=True)
            if rank0:
                _prune(complete[i:], trainer)
            return step
        if rank0:
            aside = path.with_name(f"{path.name}.corrupt")
            shutil.rmtree(aside, ignore_errors=True)
            path.rename(aside)
            log.error(f"checkpoint {path} is corrupt ({problem}); moved to {aside}, trying an older one")
            append_event(run_dir, "checkpoint_corrupt", step=step, path=str(path), problem=problem, moved_to=str(aside))
        barrier()
    return None


def _prune(good: list[tuple[int, Path]], trainer: Any) -> None:
    """Keep the checkpointer's ``max_checkpoints`` newest of ``good`` (newest first; the one just
    loaded is first): OLMo-core only trims the checkpoints its own process saved, so those of
    earlier attempts would pile up over restarts. The completion mark goes first, as OLMo-core
    removes checkpoints."""
    keep = getattr(trainer.callbacks.get("checkpointer"), "max_checkpoints", None)
    for _, path in good[keep:] if keep else []:
        log.info(f"removing old checkpoint {path}")
        (path / METADATA).unlink(missing_ok=True)
        shutil.rmtree(path, ignore_errors=True)


def checkpoint_bytes(model: Any) -> int:
    """Bytes one checkpoint of ``model`` takes: parameters plus AdamW's two moments, in the
    parameters' dtype (the optimizer state follows it). A sharded parameter (DTensor) counts
    its global size, so this is the whole checkpoint, over all ranks."""
    return 3 * sum(p.numel() * p.dtype.itemsize for p in model.parameters())


def check_disk_space(model: Any, run_dir: str | Path) -> None:
    """Fail before training when the run directory cannot hold the checkpoints OLMo-core keeps
    while it writes one: its ``max_checkpoints`` (:data:`KEEP_CHECKPOINTS`) plus the one being
    written, which it removes the oldest of only after that save. Checkpoints already in the run
    directory count as held (their bytes are no longer free). A collective, every rank raises
    together."""
    from olmo_core.distributed.utils import broadcast_object, get_rank

    from olmx.errors import LaunchError
    from olmx.rundir import RunDir

    problem = None
    if get_rank() == 0:
        need = checkpoint_bytes(model)
        held = min(len(checkpoint_dirs(RunDir(run_dir).checkpoints)[0]), KEEP_CHECKPOINTS)
        more = KEEP_CHECKPOINTS + 1 - held
        free = shutil.disk_usage(Path(run_dir)).free
        if free < more * need:
            problem = (
                f"the run directory {run_dir} has {free / 2**20:,.1f} MiB free; a checkpoint of this model "
                f"needs about {need / 2**20:,.1f} MiB and {more} more must fit (OLMo-core keeps "
                f"{KEEP_CHECKPOINTS} and writes the next before it removes the oldest; {held} already here): "
                f"free some space or choose another trainer.run_dir"
            )
    problem = broadcast_object(problem)
    if problem:
        raise LaunchError(problem)

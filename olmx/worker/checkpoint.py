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

**Asynchronous saves** (``trainer.async_save``). The step waits while the trainer state is
written and the model and optimizer state is copied to host memory (torch DCP's stager); a
background thread writes the copy into ``stepN/model_and_optim``, then verifies and publishes
it exactly as above, ``.metadata.json`` last. The save's future (:meth:`VerifiedCheckpointer.save_async`)
completes only once every rank has seen the checkpoint published, or raises what went wrong
(OLMo-core's own done-callback would swallow a failed verification). OLMo-core 3.0.0's async
save deadlocked multi-process runs for two reasons, both fixed here:

- ``Trainer.save_checkpoint_async`` records ``checkpoint/save_async_duration_s`` from that
  background thread, so the metric lands in a different step's buffer on each rank and
  ``reduce_metrics`` all-reduces tensors of different sizes on the bookkeeping group: the ranks
  wait in different ``all_reduce`` calls for good. :class:`OlmxCheckpointerCallback` starts the
  save itself and records nothing from the thread.
- olmx's verification ran its collectives on the default process group from the background
  thread while the main thread's DDP gradient all-reduces used the same gloo group: the ranks
  paired a broadcast with an all-reduce. Verification now runs on the checkpointer's own group
  (``Checkpointer.process_group``, which OLMo-core creates for async saves and only the save
  thread uses while a save is pending).

**A full disk.** An ``OSError`` ENOSPC or EDQUOT while saving (in any rank's files, the
manifest or the completion mark) is raised on every rank together (:func:`raise_together`;
torch DCP gathers its writers' errors itself); the worker then removes the partial save and
ends the run with one line (:func:`no_space_error`, :mod:`olmx.worker.run`).

On start, :func:`resume_from_verified` (not OLMo-core's ``maybe_load_checkpoint``, which takes
the newest ``stepN`` on trust) removes such partial checkpoints, re-verifies the newest
complete checkpoint against its manifest (every rank checks a share), renames a corrupt one to
``stepN.corrupt`` and tries the next older one, and loads the first that verifies with
``Trainer.load_checkpoint``. Every removal and fallback is recorded in ``events.jsonl``. Older
checkpoints beyond the checkpointer's ``max_checkpoints`` (3) are then removed: OLMo-core trims
only those its own process saved, so without this they would pile up over restarts.
"""

from __future__ import annotations

import errno
import json
import logging
import re
import shutil
import time
import zlib
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from olmo_core.train.callbacks import CheckpointerCallback
from olmo_core.train.checkpoint import Checkpointer, CheckpointerConfig

from olmx.events import append_event
from olmx.worker.faults import inject
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


#: The errors of a full disk or an exceeded quota.
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def no_space_error(exc: BaseException | None) -> OSError | None:
    """The ENOSPC/EDQUOT ``OSError`` behind ``exc`` (its causes, or a torch DCP
    ``CheckpointException``'s per-rank failures), or None."""
    seen: set[int] = set()
    todo: list[Any] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in NO_SPACE:
            return e
        failures = getattr(e, "failures", None)
        if isinstance(failures, dict):  # torch.distributed.checkpoint.api.CheckpointException
            todo.extend(f[0] if isinstance(f, tuple) else f for f in failures.values())
        todo.extend([e.__cause__, e.__context__])
    return None


def raise_together(err: OSError | None, group: Any = None) -> None:
    """A collective: raise ``err`` (an ``OSError`` one rank hit) on every rank of ``group``, so
    that none goes on into the next collective of a save alone (None everywhere: nothing)."""
    from olmo_core.distributed.utils import all_gather_object

    mine = None if err is None else (err.errno, err.strerror, err.filename)
    for got in all_gather_object(mine, group=group):
        if got is not None:
            raise err if err is not None else OSError(*got)


def _digests(ckpt: Path, files: list[str], group: Any = None) -> dict[str, list[int]]:
    """Size and CRC of ``files``, each rank reading a round-robin share, gathered on all ranks."""
    from olmo_core.distributed.utils import all_gather_object, get_rank, get_world_size

    rank, world = get_rank(group), get_world_size(group)
    mine = {f: _file_digest(ckpt / f) for f in files[rank::world]}
    merged: dict[str, list[int]] = {}
    for part in all_gather_object(mine, group=group):
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


def verify(ckpt: Path, *, write_manifest: bool = False, group: Any = None) -> str | None:
    """Verify a checkpoint on every rank together (a collective on ``group``, None: the default
    group); the problem, or None if good.

    With ``write_manifest`` (at save time) the digests are recorded (an ``OSError`` writing the
    manifest is raised on every rank); otherwise they are compared with the recorded manifest (a
    checkpoint without one, e.g. written by OLMo-core alone, is checked by structure only)."""
    from olmo_core.distributed.utils import broadcast_object, get_rank, get_world_size

    rank0 = get_rank() == 0
    src = 0 if group is None else _global_rank0(group)
    manifest: dict[str, Any] | None = None
    files: list[str] = []
    if rank0:
        if not write_manifest and (ckpt / MANIFEST).is_file():
            try:
                manifest = json.loads((ckpt / MANIFEST).read_text())
            except ValueError:
                manifest = {"files": {}, "unreadable": True}
        files = sorted(manifest["files"]) if manifest else _data_files(ckpt)
    manifest, files = broadcast_object((manifest, files), src=src, group=group)
    digests = _digests(ckpt, files, group)
    problem, err = None, None
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
            try:
                write_text_atomic(
                    ckpt / MANIFEST, json.dumps({"files": digests, "world_size": get_world_size()}), durable=True
                )
            except OSError as exc:
                err = exc
    raise_together(err, group)
    return broadcast_object(problem, src=src, group=group)


def _global_rank0(group: Any) -> int:
    """The global rank of ``group``'s first rank (torch's broadcasts name their source globally)."""
    import torch.distributed as dist

    return dist.get_global_rank(group, 0)


class VerifiedCheckpointer(Checkpointer):
    """OLMo-core's Checkpointer with a verification before the completion mark, synchronous or
    asynchronous, and full-disk errors raised on every rank together (module doc)."""

    def save_async(
        self, dir: Any, train_module: Any, train_state: dict[str, Any], ephemeral: bool = False
    ) -> Future[None]:
        """OLMo-core's ``save_async`` (trainer state now, model and optimizer state copied now and
        written by a background thread), then verification and the completion mark in that same
        thread, on this checkpointer's own process group. The future completes once the
        checkpoint is published on every rank, or raises why it is not."""
        from olmo_core.distributed.checkpoint import async_save_state_dict
        from olmo_core.distributed.utils import is_distributed
        from olmo_core.io import normalize_path
        from olmo_core.train.checkpoint import CheckpointMetadata

        if is_distributed() and self.process_group is None:
            raise RuntimeError("an asynchronous save needs the checkpointer's own process group")
        dir = normalize_path(dir)
        with self._temporary_wd(dir) as wd:  # the trainer state, then stepN-tmp renamed to stepN
            self._save_train_state(dir, wd, train_state)
        written = async_save_state_dict(
            f"{dir}/model_and_optim",
            train_module.state_dict_to_save(),
            process_group=self.process_group,
            thread_count=self.save_thread_count,
            throttle_uploads=self.throttle_uploads,
            enable_plan_caching=True,
            _skip_prepare=True,
        )
        published: Future[None] = Future()

        def publish(fut: Future[Any]) -> None:  # in the save thread, after its files are written
            try:
                fut.result()
                self._save_metadata(dir, CheckpointMetadata(ephemeral=ephemeral))
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the save
                published.set_exception(exc)
            else:
                published.set_result(None)

        written.add_done_callback(publish)
        return published

    def _save_train_state(self, dir: Any, wd: Path, train_state: dict[str, Any]) -> None:
        """OLMo-core's, with an ``OSError`` (a full disk) raised on every rank together: the
        save's next step is a collective. The ``train`` folder, which OLMo-core has the file
        system's local rank 0 create and the others wait for (up to ``FS_TIMEOUT``, 120 s), is
        created first and its error raised together too: else the others waited out that
        timeout and failed with a ``TimeoutError`` of their own."""
        from olmo_core.distributed.utils import get_fs_local_rank
        from olmo_core.io import is_url

        err = None
        try:
            inject("nospace", _step_of(Path(str(dir))), "train state")
            if is_url(dir) or get_fs_local_rank() == 0:
                (wd / "train").mkdir(exist_ok=True, parents=True)
        except OSError as exc:
            err = exc
        raise_together(err)
        try:
            super()._save_train_state(dir, wd, train_state)
        except OSError as exc:
            err = exc
        raise_together(err)

    def _save_metadata(self, dir: Any, metadata: Any) -> None:
        """Verify, then (rank 0) the completion mark; every rank returns once it is written."""
        from olmo_core.distributed.utils import get_rank

        ckpt = Path(str(dir))
        inject("killsave", _step_of(ckpt))
        problem = verify(ckpt, write_manifest=True, group=self.process_group)
        if problem is not None:
            raise CheckpointCorrupt(f"checkpoint {ckpt} failed verification after writing: {problem}")
        err = None
        if get_rank() == 0:
            try:
                super()._save_metadata(dir, metadata)
            except OSError as exc:
                err = exc
        raise_together(err, self.process_group)


@dataclass
class OlmxCheckpointerCallback(CheckpointerCallback):
    """OLMo-core's CheckpointerCallback whose asynchronous saves record nothing from the save
    thread (module doc): it starts the save itself, as ``Trainer.save_checkpoint_async`` does
    less its done-callback, and tells the callbacks ``post_checkpoint_saved`` from the main
    thread once the save is published. Uses the Trainer's private ``_log_metrics``,
    ``_join_bookkeeping_ops`` and ``_iter_callbacks`` (ai2-olmo-core 3.0.0)."""

    def _save_checkpoint(self, save_async: bool | None = None, ephemeral: bool = False) -> str:
        from olmo_core.io import join_path

        if not (save_async if save_async is not None else self.save_async):
            return str(super()._save_checkpoint(save_async=False, ephemeral=ephemeral))
        self._await_last_checkpoint()
        trainer = self.trainer
        path = str(join_path(trainer.save_folder, self.checkpointer.checkpoint_dirname(self.step)))
        start = time.perf_counter()
        # As Trainer.save_checkpoint_async: state tied to metrics is settled first.
        trainer._log_metrics()
        trainer._join_bookkeeping_ops()
        self._future = self.checkpointer.save_async(path, trainer.train_module, trainer.state_dict(), ephemeral)
        took = time.perf_counter() - start
        log.info(f"checkpoint of step {self.step}: {took:.2f} s in the step, written in the background")
        self._latest_checkpoint_step = self.step
        self._latest_checkpoint_path = path
        return path

    def _await_last_checkpoint(self, blocking: bool = True) -> Future | None:
        fut = super()._await_last_checkpoint(blocking)
        if fut is not None:
            log.info(f"checkpoint {self._latest_checkpoint_path} published")
            for callback in self.trainer._iter_callbacks():
                callback.post_checkpoint_saved(self._latest_checkpoint_path)
        return fut


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

"""How olmx writes files. One writability rule for everything olmx will write (the run
directory, the token cache, ``--out``): try to create what will be written, a directory and a
file in it, where it would be created, and remove both at once (:func:`check_writable`). And one
way to write a file whole or not at all (:func:`atomic_file`, :func:`write_text_atomic`).

Never ``os.access``: it answers from permission bits, which root ignores, so it says yes for
root on read-only mounts and on pseudo-filesystems such as ``/proc``, where nothing can be
created (``OLMX_CACHE_DIR=/proc/olmx-cache`` passed the plan and killed every worker).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from olmx.errors import ConfigError


def nearest_existing(path: Path) -> Path:
    """``path`` or the nearest of its parents that exists (``/`` at worst)."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe


def check_writable(path: Path, field: str, *, hint: str = "") -> None:
    """ConfigError naming ``field`` unless ``path`` (to be created or filled) can be written:
    where it exists it must be a directory, else its nearest existing parent must be; in that
    directory a new directory and a file in it are created and removed again. ``hint`` ends the
    message (what is written there, how to choose another place)."""
    probe = nearest_existing(path)
    where = f"'{path}'" if probe == path else f"'{path}' cannot be created: '{probe}'"
    tail = f" ({hint})" if hint else ""
    if not probe.is_dir():
        raise ConfigError(field, f"{where} is not a directory{tail}")
    made = None
    try:
        made = tempfile.mkdtemp(prefix=".olmx-probe-", dir=probe)
        with tempfile.TemporaryFile(dir=made):
            pass
    except OSError as exc:
        raise ConfigError(field, f"{where} is not writable ({exc.strerror}){tail}") from None
    finally:
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)


#: What :func:`temporary` appends to a name (``.tmp`` and the writer's process id), as a regex.
TEMPORARY_SUFFIX = r"\.tmp\d+"


def temporary(out: Path) -> Path:
    """Where this process writes ``out`` before it is complete (``OUT.tmpPID``, beside it); a
    killed writer's one is recognisable by :data:`TEMPORARY_SUFFIX`."""
    return out.with_name(f"{out.name}.tmp{os.getpid()}")


@contextmanager
def atomic_file(out: Path) -> Iterator[BinaryIO]:
    """``out`` written whole or not at all: the body writes to ``OUT.tmpPID`` (opened ``wb``),
    which replaces ``out`` when the body ends, and is removed when it fails in any way (a full
    disk, a signal, a refused id), so no half-written file is left behind."""
    tmp = temporary(out)
    try:
        with open(tmp, "wb") as f:
            yield f
        tmp.replace(out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(out: Path, text: str, *, durable: bool = False) -> None:
    """Write ``text`` (UTF-8) to ``out`` whole or not at all (:func:`atomic_file`); ``durable``
    also flushes it to the disk before it replaces ``out`` (a checkpoint's manifest)."""
    with atomic_file(out) as f:
        f.write(text.encode("utf-8"))
        if durable:
            f.flush()
            os.fsync(f.fileno())

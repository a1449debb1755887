"""Training tokens: the embedded stdlib corpus, the user's text files, or OLMo-core token files.

``stdlib`` and ``text`` are tokenized byte-level (ids 0-255 are bytes, one end-of-document id
after each file) into a raw ``uint16`` token array, the format OLMo-core's numpy datasets
read (no header). The array is written once into the cache directory under a name derived
from the files' paths, sizes and modification times, and reused; a file lock makes
concurrent ranks wait for the first writer instead of racing it.
"""

from __future__ import annotations

import glob
import hashlib
import os
import sys
import sysconfig
from pathlib import Path

import numpy as np

from olmx.config.schema import DataConfig

#: Directory names under the stdlib that hold third-party code, not the standard library.
_NOT_STDLIB = {"site-packages", "dist-packages", "__pycache__"}


def cache_dir(data: DataConfig) -> Path:
    """Where tokenized caches live."""
    if data.cache_dir:
        return Path(data.cache_dir).expanduser()
    return Path(os.environ.get("OLMX_CACHE_DIR", Path.home() / ".cache" / "olmx"))


def stdlib_files() -> list[Path]:
    """The ``.py`` files of the running Python's standard library, in a stable order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _NOT_STDLIB)
        files += [Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py")]
    return files


def text_files(paths: list[str]) -> list[Path]:
    """The files ``paths`` name (globs expanded; each pattern's matches sorted, in the given order)."""
    out: list[Path] = []
    for p in paths:
        out += [Path(m) for m in sorted(glob.glob(os.path.expanduser(p)))]
    return out


def tokenize_bytes(files: list[Path], eos_id: int, out: Path) -> int:
    """Write the byte-level tokens of ``files`` (each followed by ``eos_id``) to ``out``."""
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    total = 0
    with open(tmp, "wb") as f:
        for path in files:
            raw = path.read_bytes()
            tokens = np.empty(len(raw) + 1, dtype=np.uint16)
            tokens[:-1] = np.frombuffer(raw, dtype=np.uint8)
            tokens[-1] = eos_id
            f.write(tokens.tobytes())
            total += tokens.size
    tmp.replace(out)
    return total


def token_files(data: DataConfig) -> list[str]:
    """Paths of the token arrays for ``data``, tokenizing into the cache first if needed."""
    if data.name == "numpy":
        return [str(f) for f in text_files(data.paths)]
    files = stdlib_files() if data.name == "stdlib" else text_files(data.paths)
    key = hashlib.sha256(f"{sys.version}|{data.tokenizer.eos_id}".encode())
    for path in files:
        st = path.stat()
        key.update(f"{path}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    root = cache_dir(data)
    root.mkdir(parents=True, exist_ok=True)
    out = root / f"{data.name}-bytes-{key.hexdigest()[:16]}.u16.npy"
    from filelock import FileLock

    with FileLock(str(out) + ".lock"):
        if not out.exists():
            tokenize_bytes(files, data.tokenizer.eos_id, out)
    return [str(out)]

"""What the first-party trackers share (a helper module: no entry point names it, it imports no plugin)."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from olmx.errors import ConfigError


def check_dir(value: str, *, field: str) -> str:
    """``value`` as the plan shows it: a path relative to the run directory reads ``RUN_DIR/...``."""
    if not value.strip():
        raise ConfigError(field, "must name a folder (relative: inside the run directory)")
    return value if Path(value).is_absolute() else str(PurePosixPath("RUN_DIR", value))


def tracker_dir(run_dir: str, value: str) -> Path:
    """The folder ``value`` names: relative paths are inside the run directory."""
    return Path(run_dir) / value

"""What the first-party trackers share (a helper module: no entry point names it, it imports no plugin)."""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

from olmx.errors import ConfigError


def check_dir(value: str, *, field: str) -> str:
    """``value`` as the plan shows it: a path relative to the run directory reads ``RUN_DIR/...``."""
    if not value.strip():
        raise ConfigError(field, "must name a folder (relative: inside the run directory)")
    return value if Path(value).is_absolute() else str(PurePosixPath("RUN_DIR", value))


def tracker_dir(run_dir: str, value: str) -> Path:
    """The folder ``value`` names: relative paths are inside the run directory."""
    return Path(run_dir) / value


def plan_markdown(plan: Any) -> str:
    """The plan as the table ``olmx train`` prints, in Markdown (summary rows, then each section)."""

    def row(label: str, value: Any) -> str:
        return f"| {label} | {str(value).replace('|', '/')} |"

    lines = ["| | |", "|---|---|", *(row(k, v) for k, v in plan.summary_rows())]
    for section, rows in plan.sections.items():
        lines += [row(f"**{section}**", ""), *(row(f"&nbsp;&nbsp;{k}", v) for k, v in rows)]
    return "\n".join(lines)

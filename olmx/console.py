"""The consoles olmx prints to (the CLI's, the launchers' progress, the report's text).

In a terminal rich lays output out to the terminal's width. Written to a file or a pipe (a log,
``| less``, ``nohup``, CI) nothing is wrapped or cut: a plain line stays one line and a table
takes the width its cells need, whatever ``COLUMNS`` says (pytest-xdist, some shells and CI
runners export ``COLUMNS=80``) and even where ``FORCE_COLOR`` asks rich for colours. Whether the
output is a terminal is decided when the console is made, from the stream it writes to."""

from __future__ import annotations

from typing import IO

from rich.console import Console

#: The public names: what plugins may import from here (see olmx.api.PUBLIC_MODULES).
__all__ = ["UNBOUNDED", "make_console"]

#: The width of a console that does not write to a terminal: wider than any line olmx prints,
#: so rich neither wraps nor cuts (rich pads only tables that ask to expand, which olmx's don't).
UNBOUNDED = 1_000_000


def make_console(*, stderr: bool = False, file: IO[str] | None = None, record: bool = False) -> Console:
    """A rich console for olmx's output: no highlighting, no wrapping of plain text (a long
    path stays one line even in a terminal), and unbounded width when it does not write to a
    terminal (``stderr`` for the error stream, ``file`` for a stream of one's own)."""
    console = Console(stderr=stderr, file=file, record=record, highlight=False, soft_wrap=True)
    if not _is_tty(console.file):
        console.width = UNBOUNDED
    return console


def _is_tty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False

"""The one error tree of olmx. The CLI catches :class:`OlmxError` only, prints its message
and exits with :attr:`OlmxError.exit_code`; any other exception is a bug and keeps its
traceback."""

from __future__ import annotations

from collections.abc import Iterable

#: The public names: what plugins may import from here (see olmx.api.PUBLIC_MODULES).
__all__ = ["OlmxError", "ConfigError", "PluginError", "LaunchError", "RunFailed", "unknown_name"]

#: Up to this many known names, a message about an unknown one lists them all.
FEW_NAMES = 40


class OlmxError(Exception):
    """Base of every error that olmx reports to a user as one clean message."""

    exit_code: int = 1


class ConfigError(OlmxError):
    """A user mistake in the configuration: names the field and what is allowed."""

    exit_code = 2

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}" if field else message)


class PluginError(OlmxError):
    """A plugin is unknown, broken or incompatible with this olmx."""

    exit_code = 2


class LaunchError(OlmxError):
    """Starting or following the processes of a run failed."""

    exit_code = 1


class RunFailed(OlmxError):
    """The training processes ended with a non-zero exit code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def unknown_name(
    what: str, name: str, known: Iterable[str], *, of: str = "", label: str = "allowed", where: str = ""
) -> str:
    """The one line for a mistyped name: ``unknown task 'arc_esay'; did you mean 'arc_easy'?``
    (the closest known name: difflib's, else the one ``name`` begins), else all the known names
    where they are few (:data:`FEW_NAMES`; ``label: a, b``), else ``where`` they are listed
    (``olmx data tasks lists them``). ``of`` names the section a key is unknown in (``unknown key
    'stepz' of trainer``)."""
    import difflib

    names = sorted(set(known))
    message = f"unknown {what} '{name}'" + (f" of {of}" if of else "")
    lower = {n.lower(): n for n in names}
    close = difflib.get_close_matches(name.lower(), list(lower), n=1, cutoff=0.6)
    close = close or [n for n in lower if n.startswith(name.lower())][:1]
    if close and name:
        return f"{message}; did you mean '{lower[close[0]]}'?"
    if len(names) <= FEW_NAMES:
        return f"{message}; {label}: {', '.join(names) or 'none'}"
    return f"{message}; {where}" if where else message

"""The one error tree of olmx. The CLI catches :class:`OlmxError` only, prints its message
and exits with :attr:`OlmxError.exit_code`; any other exception is a bug and keeps its
traceback."""

from __future__ import annotations

#: The public names: what plugins may import from here (see olmx.api.PUBLIC_MODULES).
__all__ = ["OlmxError", "ConfigError", "PluginError", "LaunchError", "RunFailed"]


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

"""The exceptions of olmx's RunPod support: one tree under :class:`RunPodError`.

:class:`RunPodError` is a :class:`~olmx.errors.LaunchError`, so the CLI prints its message and
exits non-zero. No message of these errors ever carries the API key.
"""

from __future__ import annotations

from olmx.errors import LaunchError


class RunPodError(LaunchError):
    """Base of every RunPod failure; the CLI prints its message and exits non-zero."""


class RunPodAuthError(RunPodError):
    """No key, an invalid key (HTTP 401) or a key without access (HTTP 403)."""


class RunPodRequestError(RunPodError):
    """RunPod refused a request (HTTP 4xx); the message carries RunPod's explanation."""

    def __init__(self, message: str, *, status: int, detail: str = "", errors: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail
        self.errors = errors


class RunPodNoCapacityError(RunPodRequestError):
    """RunPod refused every candidate GPU type and data centre (HTTP 400 each)."""


class RunPodNotFoundError(RunPodRequestError):
    """The pod or cluster does not exist (HTTP 404); the message names its id."""


class RunPodConflictError(RunPodRequestError):
    """The action is not valid in the resource's current state (HTTP 409)."""


class RunPodUnavailableError(RunPodError):
    """RunPod kept failing (429, 5xx, timeouts) until the retry budget ran out."""


class RunPodPodFailedError(RunPodError):
    """A pod or cluster stopped, failed or vanished while olmx waited for it."""


class RunPodWaitTimeout(RunPodError):
    """A pod or cluster was not running with SSH reachable before the deadline."""


class RunPodOrphanError(RunPodError):
    """Something olmx created could not be terminated; it may still be running and billing."""

    def __init__(self, message: str, *, resource_id: str | None, command: str | None) -> None:
        super().__init__(message)
        self.resource_id = resource_id
        self.command = command

"""The HTTP transport of olmx's RunPod client: the key, the base URL, one JSON call with retries.

It sends JSON over HTTPS with :mod:`urllib.request` (standard library only) and turns RunPod's
answers into decoded objects or :class:`~.errors.RunPodError` subclasses. Why not the ``runpod``
SDK: its 1.12.0 release speaks GraphQL, which RunPod is retiring, and imports slowly
(docs/research/cli-infra-plugins.md §4.1). Errors are RFC 9457 problem objects
``{title, status, detail, errors?}``; ``429`` carries ``Retry-After`` in seconds.

Base URL: ``RUNPOD_API_BASE_URL`` is the host without ``/v2``, as in runpod-python's REST
transport (``runpod/api/rest.py``); a trailing ``/v2`` (the form RunPod's docs print) is
accepted and dropped.

Safety rules that the tests hold: the API key is only ever placed in the ``Authorization``
header (unredirected, never over plain HTTP except to localhost); it is never part of a repr,
log line or error message, and errors are raised outside ``except`` blocks so that no
traceback carries urllib frames whose locals hold the header. Retries (``429``, ``5xx``,
timeouts, dropped connections) back off exponentially, honour ``Retry-After`` and stop at a
total time limit. A call whose outcome is unknown (``5xx`` or a timeout after the request was
sent) may be resolved by the caller's ``recover`` instead of being repeated (creates use it,
see :mod:`.rest`). Backoff has no jitter: one olmx process makes one call at a time.
:func:`redacted_request` renders a request for ``--dry-run`` with every secret redacted.
"""

from __future__ import annotations

import email.utils
import http.client
import json
import logging
import os
import re
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from email.message import Message
from pathlib import Path
from typing import Any, NoReturn, Self

from olmx import __version__

from .errors import (
    RunPodAuthError,
    RunPodConflictError,
    RunPodError,
    RunPodNotFoundError,
    RunPodRequestError,
    RunPodUnavailableError,
)

JSON = dict[str, Any]

#: RunPod's API host; the client appends ``/v2/...``.
DEFAULT_BASE_URL = "https://api.runpod.io"
#: Environment variable that overrides :data:`DEFAULT_BASE_URL` (tests point it at a fake).
BASE_URL_ENV = "RUNPOD_API_BASE_URL"
#: Environment variable holding the API key; it wins over the key file.
API_KEY_ENV = "RUNPOD_API_KEY"
#: Where the key is read from when :data:`API_KEY_ENV` is unset.
DEFAULT_KEY_FILE = "~/.runpod/olmx_api_key"

_log = logging.getLogger(__name__)
_USER_AGENT = f"olmx/{__version__} (+urllib)"
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}
_SECRET_ENV_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
#: Public keys (``PUBLIC_KEY``, RunPod's variable for SSH; ``SSH_PUBKEY``) are not secrets.
_PUBLIC_KEY_NAME = re.compile(r"PUBLIC_?KEY|PUBKEY", re.IGNORECASE)


def looks_secret(name: str) -> bool:
    """Whether an environment variable's name looks like a secret's (``*KEY*``, ``*TOKEN*``,
    ``*SECRET*``, ``*PASSWORD*``, ``*CREDENTIAL*``; a public key's name does not count)."""
    return bool(_SECRET_ENV_NAME.search(_PUBLIC_KEY_NAME.sub("", name)))


_REDACTED = "<redacted>"
#: A value RunPod fills in from one of its secrets inside the pod: a name, not a secret.
SECRET_REFERENCE = re.compile(r"\{\{ RUNPOD_SECRET_[A-Za-z0-9_-]+ \}\}")


@dataclass(frozen=True)
class RetryPolicy:
    """How long to keep retrying 429s, 5xx answers, timeouts and dropped connections."""

    max_attempts: int = 6
    """Requests sent at most, the first one included."""
    base_delay: float = 1.0
    """Delay before the first retry in seconds; doubles with every retry."""
    max_delay: float = 30.0
    """Upper bound of one backoff delay (a longer ``Retry-After`` still wins)."""
    total_time: float = 120.0
    """Upper bound in seconds of all attempts and waits of one call together."""

    def backoff(self, retry: int) -> float:
        """Delay before retry number ``retry`` (1-based), without ``Retry-After``."""
        return min(self.max_delay, self.base_delay * 2.0 ** (retry - 1))


def resolve_base_url(base_url: str | None = None) -> str:
    """The API host to talk to: ``base_url``, else :data:`BASE_URL_ENV`, else RunPod's.

    Refuses plain ``http://`` except to localhost, so the key never travels in clear text.
    """
    url = (base_url or os.environ.get(BASE_URL_ENV) or DEFAULT_BASE_URL).strip().rstrip("/")
    url = url.removesuffix("/v2")
    parts = urllib.parse.urlsplit(url)
    if not parts.hostname or not (parts.scheme == "https" or (parts.scheme == "http" and parts.hostname in _LOOPBACK)):
        raise RunPodError(
            f"{BASE_URL_ENV}={url!r} is not usable: it must be an https:// URL "
            "(plain http:// only for localhost), so that the API key is never sent in clear text"
        )
    return url


def redacted_request(
    method: str, path: str, body: Mapping[str, Any] | None = None, *, base_url: str | None = None
) -> str:
    """The request olmx would send, as text for ``--dry-run``: method, URL, headers, JSON body.

    The ``Authorization`` header shows ``<redacted>``, and so does the value of every ``env``
    entry whose name looks secret (``*KEY*``, ``*TOKEN*``, ``*SECRET*``, ``*PASSWORD*``, ...)
    unless it is a RunPod secret reference (``{{ RUNPOD_SECRET_name }}``); everything else is
    exactly what would be sent. Needs no API key.
    """
    lines = [
        f"{method.upper()} {resolve_base_url(base_url)}{path}",
        f"Authorization: Bearer {_REDACTED}",
    ]
    if body is not None:
        shown = dict(body)
        if isinstance(shown.get("env"), Mapping):
            shown["env"] = {
                k: _REDACTED if looks_secret(k) and not SECRET_REFERENCE.fullmatch(str(v)) else v
                for k, v in shown["env"].items()
            }
        lines += ["Content-Type: application/json", "", json.dumps(shown, indent=2)]
    text = "\n".join(lines)
    key = os.environ.get(API_KEY_ENV, "").strip()
    return text.replace(key, _REDACTED) if key else text


class _Secret:
    """Holds the API key; every way of printing it prints ``<redacted>``."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The key itself, for the Authorization header only."""
        return self._value

    def __repr__(self) -> str:
        return _REDACTED

    __str__ = __repr__

    def __reduce__(self) -> NoReturn:
        raise TypeError("the RunPod API key cannot be pickled")


def _load_key(key_file: str | os.PathLike[str] | None) -> tuple[_Secret, str]:
    """The key from :data:`API_KEY_ENV` or the key file, and where it came from."""
    path = Path(key_file or DEFAULT_KEY_FILE).expanduser()
    key, source = os.environ.get(API_KEY_ENV, "").strip(), API_KEY_ENV
    if not key:
        source = str(path)
        try:
            key = path.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise RunPodAuthError(f"cannot read the RunPod API key file {path}: {exc.strerror}") from None
    if not key:
        raise RunPodAuthError(
            f"no RunPod API key: set {API_KEY_ENV} or write the key to {path} (chmod 600); "
            "create one at https://www.runpod.io/console/user/settings"
        )
    return _Secret(key), source


@dataclass(frozen=True)
class _Response:
    status: int
    headers: Message
    body: bytes = field(repr=False)  # may echo anything; never shown in tracebacks


@dataclass(frozen=True)
class _Failure:
    """No HTTP answer. ``ambiguous``: the request may have reached RunPod."""

    reason: str
    ambiguous: bool


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a 3xx is answered as an error, never followed


def _retry_after(headers: Message) -> float | None:
    value = headers.get("Retry-After")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        try:
            return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
        except (TypeError, ValueError):
            return None


def _problem(body: bytes) -> tuple[str, str, tuple[str, ...]]:
    """(title, detail, errors) of an RFC 9457 problem body, tolerating anything else."""
    try:
        data = json.loads(body)
    except ValueError:
        return "", body.decode("utf-8", "replace").strip()[:500], ()
    if not isinstance(data, dict):
        return "", str(data)[:500], ()
    errors = data.get("errors") or ()
    detail = data.get("detail") or data.get("message") or data.get("error") or ""
    return str(data.get("title") or ""), str(detail), tuple(str(e) for e in errors)


class RunPodTransport:
    """The HTTP side of :class:`~.provision.RunPodClient`: the key, the base URL and one API
    call at a time, with retries under ``retry`` and errors meant for the user.

    Build one with :meth:`from_env` (key from ``RUNPOD_API_KEY`` or a key file, base URL from
    ``RUNPOD_API_BASE_URL``).
    """

    def __init__(
        self,
        api_key: str | _Secret,
        *,
        base_url: str | None = None,
        timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        key_source: str = "the API key",
    ) -> None:
        """``timeout``: seconds one HTTP request may take; ``key_source``: where the key came
        from, named (never shown) in authentication errors."""
        self._key = api_key if isinstance(api_key, _Secret) else _Secret(api_key)
        del api_key  # no frame of a traceback raised below may hold the key in its locals
        if not re.fullmatch(r"[\x21-\x7e]+", self._key.reveal() or ""):
            raise RunPodAuthError(
                f"the RunPod API key from {key_source} is empty or contains spaces or non-ASCII characters"
            )
        self._key_source = key_source
        self.base_url = resolve_base_url(base_url)
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        loopback = urllib.parse.urlsplit(self.base_url).hostname in _LOOPBACK
        proxies = urllib.request.ProxyHandler({} if loopback else None)
        self._opener = urllib.request.build_opener(proxies, _NoRedirect())

    @classmethod
    def from_env(cls, *, key_file: str | os.PathLike[str] | None = None, **kwargs: Any) -> Self:
        """A client whose key is ``$RUNPOD_API_KEY`` or the content of ``key_file``
        (default ``~/.runpod/olmx_api_key``); other arguments as for the constructor."""
        secret, source = _load_key(key_file)
        return cls(secret, key_source=source, **kwargs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_url={self.base_url!r}, api_key={_REDACTED})"

    def describe(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> str:
        """:func:`redacted_request` against this client's base URL, this key scrubbed too."""
        return self._scrub(redacted_request(method, path, body, base_url=self.base_url))

    def _request(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        query: Mapping[str, str] | None = None,
        resource: str | None = None,
        recover: Callable[[str], JSON | None] | None = None,
    ) -> JSON:
        """Send one API call with retries; the decoded JSON object (``{}`` for ``204``).

        ``recover`` is called after a failure that may have been applied (``5xx``, timeout)
        and may return the result instead of retrying (used by creates).
        """
        url_path = path + (f"?{urllib.parse.urlencode(query)}" if query else "")
        payload = None if body is None else json.dumps(body).encode("utf-8")
        start = time.monotonic()
        ambiguous_before = False
        for attempt in range(1, self.retry.max_attempts + 1):
            budget = self.retry.total_time - (time.monotonic() - start)
            outcome = self._send(method, url_path, payload, timeout=max(0.001, min(self.timeout, budget)))
            retry_after = None
            if isinstance(outcome, _Response):
                _log.debug("RunPod %s %s -> HTTP %d", method, url_path, outcome.status)
                if outcome.status < 300:
                    return self._decode(method, path, outcome)
                if outcome.status == 404 and method == "DELETE" and ambiguous_before:
                    return {}  # an earlier attempt that "failed" did delete it
                if outcome.status != 429 and outcome.status < 500:
                    self._raise_http(method, path, outcome, resource)
                reason, ambiguous = f"HTTP {outcome.status}", outcome.status >= 500
                retry_after = _retry_after(outcome.headers)
            else:
                reason, ambiguous = outcome.reason, outcome.ambiguous
            ambiguous_before = ambiguous_before or ambiguous
            if ambiguous and recover is not None and (found := recover(reason)) is not None:
                return found
            delay = max(self.retry.backoff(attempt), retry_after or 0.0)
            elapsed = time.monotonic() - start
            if attempt == self.retry.max_attempts or elapsed + delay >= self.retry.total_time:
                asked = f"; RunPod asked to wait {retry_after:g} s" if retry_after else ""
                raise RunPodUnavailableError(
                    f"RunPod did not answer {method} {path} successfully: {reason} after "
                    f"{attempt} attempt(s) in {elapsed:.1f} s{asked} (retry budget "
                    f"{self.retry.total_time:g} s). Try again later; https://status.runpod.io "
                    "shows outages."
                )
            _log.warning(
                "RunPod %s %s: %s; retry %d/%d in %.2f s",
                method,
                path,
                reason,
                attempt,
                self.retry.max_attempts - 1,
                delay,
            )
            time.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    def _send(self, method: str, url_path: str, payload: bytes | None, *, timeout: float) -> _Response | _Failure:
        """One HTTP exchange. Never raises for network trouble: errors are built by the
        caller outside any ``except`` block, so no urllib frame (whose locals hold the
        Authorization header) ends up in a traceback."""
        request = urllib.request.Request(self.base_url + url_path, data=payload, method=method)
        request.add_header("Accept", "application/json")
        request.add_header("User-Agent", _USER_AGENT)
        if payload is not None:
            request.add_header("Content-Type", "application/json")
        request.add_unredirected_header("Authorization", "Bearer " + self._key.reveal())
        outcome: _Response | _Failure | None = None
        try:
            with self._opener.open(request, timeout=timeout) as response:
                outcome = _Response(response.status, response.headers, response.read())
        except KeyboardInterrupt:
            pass  # re-raised below, without the urllib frames
        except urllib.error.HTTPError as exc:
            try:
                outcome = _Response(exc.code, exc.headers, exc.read())
            except (OSError, http.client.HTTPException):
                outcome = _Response(exc.code, exc.headers, b"")
        except urllib.error.URLError as exc:
            not_sent = isinstance(exc.reason, (ConnectionRefusedError, socket.gaierror))
            outcome = _Failure(f"{type(exc.reason).__name__}: {exc.reason}", ambiguous=not not_sent)
        except (OSError, http.client.HTTPException) as exc:  # timeouts, resets while reading
            outcome = _Failure(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__, ambiguous=True)
        if outcome is None:
            raise KeyboardInterrupt
        return outcome

    def _decode(self, method: str, path: str, response: _Response) -> JSON:
        if response.status == 204 or not response.body.strip():
            return {}
        try:
            data = json.loads(response.body)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise RunPodError(f"RunPod answered {method} {path} with HTTP {response.status} but no JSON object")
        return data

    def _raise_http(self, method: str, path: str, response: _Response, resource: str | None) -> NoReturn:
        status = response.status
        title, detail, errors = _problem(response.body)
        detail, errors = self._scrub(detail), tuple(self._scrub(e) for e in errors)
        said = f": {detail}" if detail else ""
        if status == 401:
            raise RunPodAuthError(
                f"RunPod rejected the API key from {self._key_source} (HTTP 401: missing, "
                "malformed, expired or invalid). Create a key at "
                f"https://www.runpod.io/console/user/settings and set {API_KEY_ENV}."
            )
        if status == 403:
            raise RunPodAuthError(
                f"the RunPod API key from {self._key_source} is valid but may not {method} "
                f"{path} (HTTP 403{said}); give the key read/write access to pods and clusters"
            )
        where = f"{method} {path}"
        if status == 404:
            raise RunPodNotFoundError(
                f"RunPod has no {resource or 'such resource'} (HTTP 404 on {where}{said})",
                status=status,
                detail=detail,
            )
        listed = "".join(f"\n  - {e}" for e in errors)
        message = f"RunPod refused {where} (HTTP {status}{' ' + title if title else ''}){said}{listed}"
        cls = RunPodConflictError if status == 409 else RunPodRequestError
        raise cls(message, status=status, detail=detail, errors=errors)

    def _scrub(self, text: str) -> str:
        """``text`` with this client's key replaced, should RunPod ever echo it back."""
        return text.replace(self._key.reveal(), _REDACTED)

"""Loaded by every Python process of a test run (the test puts this folder on PYTHONPATH):
makes ``beaker`` and ``gantry`` (and their submodules) unimportable, and records in
``$OLMX_BLOCKER_LOG`` that the process ran with the blocker (``active``), every attempt to
import a blocked module (``import``) and every connection to an address outside this machine
(``connect``, from the ``socket.connect`` audit event)."""

import atexit
import importlib.abc
import os
import sys

_LOG = os.environ.get("OLMX_BLOCKER_LOG")
_BLOCKED = {"beaker", "gantry"}


def _record(kind: str, what: str) -> None:
    if _LOG:
        with open(_LOG, "a") as f:
            f.write(f"{kind} {os.getpid()} {what}\n")


class _Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in _BLOCKED:
            frame = sys._getframe(1)
            while frame is not None and (
                frame.f_code.co_filename.startswith("<frozen") or frame.f_code.co_filename == __file__
            ):
                frame = frame.f_back
            _record("import", f"{name} from {frame.f_code.co_filename if frame else '?'}")
            raise ImportError(f"{name} is blocked by olmx's test (runs outside Beaker must not need it)")
        return None


def _audit(event, args):
    if event == "socket.connect":
        address = args[1]
        if isinstance(address, tuple) and address and not str(address[0]).startswith(("127.", "::1", "localhost")):
            _record("connect", repr(address))


sys.meta_path.insert(0, _Blocker())
sys.addaudithook(_audit)
_record("active", " ".join(sys.argv[:4]))
atexit.register(lambda: [_record("loaded", m) for m in list(sys.modules) if m.partition(".")[0] in _BLOCKED])

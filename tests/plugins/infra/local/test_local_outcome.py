"""How the local launcher ends when torchrun itself was ended by a signal."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from rich.console import Console

from olmx.errors import RunFailed
from olmx_plugins.infra.local import LOCAL


def conclude(tmp_path, rc: int, interrupted: bool) -> RunFailed:
    """How the launcher ends a launch whose torchrun returned ``rc`` with nothing recorded."""
    plan = SimpleNamespace(run_dir=str(tmp_path))
    cfg = SimpleNamespace(nnodes=1, max_restarts=0)
    log = tmp_path / "node0.log"
    log.write_text("")
    with pytest.raises(RunFailed) as info:
        LOCAL._conclude(
            plan,
            cfg,
            launch_id="x",
            rc=rc,
            started=0.0,
            log_path=log,
            offset=0,
            interrupted=interrupted,
            console=Console(file=open(tmp_path / "out", "w")),  # noqa: SIM115
            recorder=SimpleNamespace(poll=lambda: []),
        )
    return info.value


def test_torchrun_ended_by_a_signal_is_that_signals_status_never_a_negative_one(tmp_path):
    """SIGTERM just after torchrun started (before it could pass it on) ended olmx train with 241
    ("training failed with exit code -15"): the negative return code was passed on."""
    failed = conclude(tmp_path, -15, interrupted=False)
    assert failed.exit_code == 75  # stopped, resume me: the one code at every phase
    assert "torchrun was ended by SIGTERM before its processes saved anything" in str(failed)


def test_a_ctrl_c_that_ends_torchrun_before_anything_was_saved_is_130(tmp_path):
    """A Ctrl-C in start-up, passed on to torchrun before its processes ran a step, ended olmx
    train with 75 where every other Ctrl-C ends with 130 (the random-instant fault test, seed
    108423382: a double Ctrl-C 4 s after the launch began)."""
    failed = conclude(tmp_path, -2, interrupted=True)
    assert failed.exit_code == 130
    assert str(failed).startswith("interrupted, torchrun was ended by SIGINT before its processes saved anything")

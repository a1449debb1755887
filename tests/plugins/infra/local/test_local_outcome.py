"""How the local launcher ends when torchrun itself was ended by a signal."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from rich.console import Console

from olmx.errors import RunFailed
from olmx_plugins.infra.local import LOCAL


def test_torchrun_ended_by_a_signal_is_that_signals_status_never_a_negative_one(tmp_path):
    """SIGTERM just after torchrun started (before it could pass it on) ended olmx train with 241
    ("training failed with exit code -15"): the negative return code was passed on."""
    plan = SimpleNamespace(run_dir=str(tmp_path))
    cfg = SimpleNamespace(nnodes=1, max_restarts=0)
    log = tmp_path / "node0.log"
    log.write_text("")
    with pytest.raises(RunFailed) as info:
        LOCAL._conclude(
            plan,
            cfg,
            launch_id="x",
            rc=-15,
            started=0.0,
            log_path=log,
            offset=0,
            interrupted=False,
            console=Console(file=open(tmp_path / "out", "w")),  # noqa: SIM115
            recorder=SimpleNamespace(poll=lambda: []),
        )
    assert info.value.exit_code == 75  # stopped, resume me: the one code at every phase
    assert "torchrun was ended by SIGTERM before its processes saved anything" in str(info.value)

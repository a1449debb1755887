"""``trainer.profile``: the plan says which steps are traced and refuses what cannot run; a
real run writes one Chrome trace of exactly those steps into ``RUN_DIR/profile/``."""

from __future__ import annotations

import gzip
import json

import pytest

from olmx.errors import ConfigError
from olmx.plan.resolve import plan_from_overrides
from olmx.registry import registry
from tests.conftest import olmx_cli

ONE = ["infra.nproc_per_node=1", "parallel=[]"]


def test_the_plan_names_the_traced_steps_and_refuses_what_cannot_run():
    plan = plan_from_overrides([*ONE, "trainer.profile=true", "trainer.profile_start=3"], registry())
    notes = [n for n in plan.execution.notes if n.startswith("profile:")]
    assert notes == [
        "profile: rank 0, steps 3-4 (CPU activity, Python stacks; step 2 warms up): a Chrome trace in "
        "RUN_DIR/profile/; those steps run slower"
    ]
    cases = [
        (["trainer.profile=true", "trainer.max_steps=4", "trainer.profile_start=4"], "trainer.profile_start", "4-5"),
        (["trainer.memory_snapshot=true"], "trainer.memory_snapshot", "set trainer.profile=true too"),
        (["trainer.profile=true", "trainer.memory_snapshot=true"], "trainer.memory_snapshot", "CUDA allocations"),
        (["trainer.profile=true", "trainer.profile_start=1"], "trainer.profile_start", "an integer >= 2"),
    ]
    for overrides, field, text in cases:
        with pytest.raises(ConfigError) as info:
            plan_from_overrides([*ONE, *overrides], registry())
        assert info.value.field == field and text in str(info.value), str(info.value)


@pytest.mark.dist
def test_a_run_writes_a_trace_of_exactly_the_profiled_steps(tmp_path):
    run = tmp_path / "run"
    small = ["model.d_model=64", "model.n_layers=2", "data.seq_len=64", "trainer.global_batch_size=8"]
    done = olmx_cli(
        "train",
        *ONE,
        *small,
        "trainer.report=false",
        "trainer.max_steps=3",  # the window ends the run: closed by the callback, not by a next batch
        "trainer.profile=true",
        "trainer.profile_start=2",
        f"trainer.run_dir={run}",
        env={"OLMX_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert [p.name for p in (run / "profile").iterdir()] == ["rank0-steps-2-3.chrome_trace.json.gz"]
    trace = json.loads(gzip.decompress((run / "profile" / "rank0-steps-2-3.chrome_trace.json.gz").read_bytes()))
    names = [e.get("name", "") for e in trace["traceEvents"]]
    # torch.profiler numbers the schedule's steps from 0; OLMo-core steps it as batch k+1 loads
    assert sorted({n for n in names if n.startswith("ProfilerStep#")}) == ["ProfilerStep#1", "ProfilerStep#2"]
    assert sum(n.startswith("aten::") for n in names) > 1000  # the model's ops, traced

"""The one order in which the core calls a run's plugins (olmx.kinds.plugins_in_order)."""

from __future__ import annotations

from olmx.config.compose import compose, to_object
from olmx.kinds import KIND_ORDER, plugins_in_order
from olmx.registry import registry


def test_every_hook_runs_layers_then_precision_then_parallel_then_trackers() -> None:
    assert KIND_ORDER == ("layer", "precision", "parallel", "tracker")
    reg = registry()
    overrides = ["layers=[engram,moe]", "precision=bf16", "parallel=[fsdp]", "trackers=[tensorboard]"]
    run = to_object(compose(overrides, reg), reg)
    names = [(p.kind, p.name) for p, _ in plugins_in_order(run, reg)]
    # moe (order 10) before engram (its order is later), whatever the listing says
    assert names == [("layer", "moe"), ("layer", "engram"), ("precision", "bf16"), ("parallel", "fsdp"),
                     ("tracker", "tensorboard")]  # fmt: skip
    subset = plugins_in_order(run, reg, kinds=("parallel", "layer"))  # the same order whatever is asked
    assert [(p.kind, p.name) for p, _ in subset] == [("layer", "moe"), ("layer", "engram"), ("parallel", "fsdp")]

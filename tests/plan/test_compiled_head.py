"""The plan's output-layer term for compiled runs: OLMo-core compiles the LM head with the blocks,
and the compiled head keeps its logits in the compute dtype for backward, where the eager head
keeps two float32 logits-sized tensors (the loss's float32 input and log-softmax). Counted with
saved-tensor hooks on OLMo-core's LM head with its loss, as ``benchmarks/compiled_activations.py``
counts it (its ``measure_head``), and compared with :data:`olmx.plan.memory.COMPILED_HEAD_LOGITS`."""

from __future__ import annotations

from olmx.plan.memory import COMPILED_HEAD_LOGITS
from tests.conftest import script_module


def test_a_compiled_head_keeps_its_logits_in_the_compute_dtype() -> None:
    bench = script_module("benchmarks/compiled_activations.py", "compiled_activations")
    eager, compiled = bench.measure_head(False), bench.measure_head(True)
    assert eager["logits_per_entry"] == 8  # two float32 copies: the plan's eager 2 x 4
    assert compiled["logits_per_entry"] == COMPILED_HEAD_LOGITS * 2  # the bf16 logits only
    assert compiled["kept"] < eager["kept"] / 3

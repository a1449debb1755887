"""``torch.compile`` over every data-parallel strategy and layer plugin, on 2 gloo processes,
through the worker's own build (``build_model``, ``build_trainer``, ``Trainer.fit``) with the
``aot_eager`` backend (dynamo's tracing and AOT autograd, no inductor code generation).

Asserted from dynamo's counters: no frame fell back to eager (every frame dynamo started was
compiled), the dense model traces without a graph break, and where layers break the graph it
is only at the data-dependent points that cannot be traced (token counts per expert, the
unique rows a sharded table exchanges, the split sizes of an all-to-all) or at FSDP2's own
hooks, never an unsupported construct. The Ulysses exchange alone is checked with
``fullgraph=True`` in tests/plugins/parallel/test_ulysses_compile.py.

OLMo-core 3.0.0 applies ``torch.compile`` only where CUDA is available, so here the test calls
the model's own ``apply_compile()`` where OLMo-core's train module would (after the plugins'
model edits, before DDP/FSDP).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.dist

#: Every strategy and layer plugin at least once (name -> overrides). MoE computes in bfloat16:
#: torch 2.13's meta kernel of grouped_mm, which tracing uses, takes only bfloat16.
CONFIGS = {
    "fsdp + ulysses + engram": ["parallel=[fsdp,ulysses]", "layers=[engram]"],
    "fsdp + engram sharded 1d": ["parallel=[fsdp]", "layers=[engram]", "layers.engram.sharding=1d"],
    "ddp + moe": ["parallel=[ddp]", "layers=[moe]", "precision=bf16"],
    "hsdp + moe": ["parallel=[hsdp]", "layers=[moe]", "precision=bf16"],
    "ddp_ep + moe": ["parallel=[ddp_ep]", "layers=[moe]", "precision=bf16"],
    "fsdp dense": ["parallel=[fsdp]"],
}
#: Graph-break reasons allowed where layers need data-dependent shapes (dynamo's wording).
DATA_DEPENDENT = ("Dynamic shape operator", "Data dependent operator")
#: FSDP2's hooks, which dynamo is told not to trace (``torch._dynamo.disable``).
FSDP_HOOKS = "function `disable`"
#: olmx functions left to eager on purpose (``torch.compiler.disable``), each documented where
#: it is defined: the MoE's per-expert count (sync-free, but traced it trips AOT autograd).
EAGER_ON_PURPOSE = ("count_per_expert",)


def _compile_all(root: str) -> dict[str, dict]:
    import functools
    import os

    import olmo_core.distributed.parallel as olmo_parallel
    import torch
    import torch._dynamo
    import torch.distributed as dist
    from torch._dynamo.utils import counters

    from olmx.plan.resolve import plan_from_overrides
    from olmx.registry import registry
    from olmx.worker.model import build_model
    from olmx.worker.train import build_trainer

    os.environ["RANK"] = str(dist.get_rank())  # as torchrun sets it for olmx's callbacks
    reg = registry()
    out: dict[str, dict] = {}
    for i, (name, overrides) in enumerate(CONFIGS.items()):
        common = [
            "infra.nproc_per_node=2",
            "trainer.max_steps=2",
            "trainer.report=false",
            "eval.interval=0",  # evaluation would compile the model once more, for its no-grad graphs
            f"trainer.run_dir={root}/{i}",
        ]
        plan = plan_from_overrides([*common, *overrides], reg)
        dist.barrier()  # both ranks resolve before either writes into the run dir (it must be new then)
        real = torch.compile
        torch.compile = functools.partial(real, backend="aot_eager")  # type: ignore[assignment]
        try:
            torch._dynamo.reset()
            counters.clear()
            olmo_parallel._WORLD_MESH = None  # one OLMo-core world mesh per process otherwise
            model = build_model(plan, reg)
            model.apply_compile()
            trainer = build_trainer(plan, reg, model)
            trainer.fit()
        finally:
            torch.compile = real
        out[name] = {
            "frames": dict(counters["frames"]),
            "graph_breaks": dict(counters["graph_break"]),
            "captured": counters["stats"]["calls_captured"],
        }
    if dist.get_rank() == 0:
        import json

        with open(f"{root}/counters.json", "w") as f:
            json.dump(out, f)
    return out


def test_every_strategy_and_layer_compiles_with_no_frame_falling_back(tmp_path):
    import json

    from olmo_core.testing import run_distributed_test

    run_distributed_test(_compile_all, world_size=2, backend="gloo", start_method="spawn", func_args=(str(tmp_path),))
    results = json.loads((tmp_path / "counters.json").read_text())
    assert list(results) == list(CONFIGS)
    for name, r in results.items():
        assert r["captured"] > 50, (name, r)  # dynamo really traced the blocks
        assert r["frames"]["total"] == r["frames"]["ok"], (name, r["frames"])
        for reason in r["graph_breaks"]:
            on_purpose = any(f"<function {fn} at" in reason for fn in EAGER_ON_PURPOSE)
            assert reason.startswith(DATA_DEPENDENT) or FSDP_HOOKS in reason or on_purpose, (name, reason)
    for name in ("fsdp + ulysses + engram", "fsdp dense"):
        assert not results[name]["graph_breaks"], (name, results[name]["graph_breaks"])

"""``trainer.activation_checkpointing=budget`` (OLMo-core's ``mode=budget``, OLMo 3 32B's script):
torch.compile's min-cut partitioner keeps at most ``trainer.activation_memory_budget`` of what a
compiled block keeps and recomputes the rest. The plan's two terms for it are checked against
what the partitioner really does to an OLMo-core block compiled on CPU: the bytes autograd saves
(saved-tensor hooks, as ``benchmarks/compiled_activations.py`` counts) and the matmul FLOPs of
its backward graph (the recompute is what exceeds twice the forward's)."""

from __future__ import annotations

from typing import Any

import pytest

from olmx.errors import ConfigError
from olmx.plan.memory import budget_block_activations
from olmx.plan.throughput import budget_recompute

#: A block with OLMo 3 32B's width ratios (feed-forward 5.4 d, 8 query heads a kv head, head 64),
#: 2 sequences of 256 tokens (no width equals 256 or 512).
D, HEADS, KV, HIDDEN, BATCH, SEQ = 320, 5, 1, 1728, 2, 256


def _block() -> Any:
    import torch

    from olmx.config.schema import Block, ModelConfig
    from olmx.worker.model import build_model_config

    torch.manual_seed(0)
    model = ModelConfig(
        d_model=D,
        n_layers=1,
        n_heads=HEADS,
        n_kv_heads=KV,
        hidden_size=HIDDEN,
        block=Block.reordered_norm,
        qk_norm=True,
    )
    built = build_model_config(model, vocab_size=384, attention="torch", seq_len=SEQ).build(init_device="cpu")
    return built.blocks["0"].to(torch.bfloat16)


def _compiled(budget: float) -> tuple[int, int, int]:
    """``(bytes per token saved for backward, forward matmul FLOPs, backward matmul FLOPs)`` of
    the block compiled with the inductor's decompositions and min-cut partitioner under
    ``budget`` (no code generation: the graphs run as they are)."""
    import torch
    import torch._functorch.config as functorch_config
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from torch._inductor.compile_fx import select_decomp_table

    graphs: dict[str, Any] = {}

    def keep(name: str) -> Any:
        def compiler(gm: Any, _inputs: Any) -> Any:
            graphs[name] = gm
            return make_boxed_func(gm.forward)

        return compiler

    backend = aot_autograd(
        fw_compiler=keep("forward"),
        bw_compiler=keep("backward"),
        partition_fn=min_cut_rematerialization_partition,
        decompositions=select_decomp_table(),
    )
    block = _block()
    params = {p.untyped_storage().data_ptr() for p in block.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()  # tensors with a token dimension, once per storage; not RoPE's tables
        if t.dim() >= 2 and (t.shape[0] in (BATCH, BATCH * SEQ)) and s.data_ptr() not in params:
            saved[s.data_ptr()] = s.nbytes()
        return t

    torch._dynamo.reset()
    with functorch_config.patch(activation_memory_budget=budget):
        block.compile(fullgraph=False, backend=backend)
        x = torch.randn(BATCH, SEQ, D, dtype=torch.bfloat16, requires_grad=True)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = block(x)
        y.float().square().mean().backward()
    torch._dynamo.reset()

    def matmul_flops(gm: Any) -> int:
        out = 0
        for node in gm.graph.nodes:
            if node.op == "call_function" and str(node.target) in ("aten.mm.default", "aten.addmm.default"):
                a, b = node.args[-2].meta["val"], node.args[-1].meta["val"]
                out += 2 * a.numel() * b.shape[-1]
        return out

    return sum(saved.values()) // (BATCH * SEQ), matmul_flops(graphs["forward"]), matmul_flops(graphs["backward"])


def test_the_budget_terms_bound_what_the_partitioner_keeps_and_recomputes() -> None:
    kept_all, forward, backward = _compiled(1.0)
    assert backward == 2 * forward  # no budget: nothing recomputed
    block_input = D * 2
    for budget in (0.5, 0.3):
        kept, forward_b, backward_b = _compiled(budget)
        planned = budget_block_activations(kept_all, block_input, budget)
        # whole tensors: 0.79-1.07x the share (benchmarks/results/memory_model.md), well under none
        assert 0.75 * planned <= kept <= 1.08 * planned, (budget, kept, planned)
        assert kept < 0.7 * kept_all
        recomputed = backward_b - 2 * forward_b
        assert forward_b == forward
        # the plan's matmul share bounds what was recomputed (the attention term aside: no matmul)
        assert 0 < recomputed <= budget_recompute(forward, 0, budget), (budget, recomputed / forward)


def test_budget_needs_a_compiled_run(tmp_path) -> None:
    """On CPUs nothing is compiled (OLMo-core compiles only with CUDA): budget is refused at
    plan time, naming the modes that work; on GPUs the plan counts its recompute."""
    from olmx.planning import plan_run

    with pytest.raises(ConfigError, match="budget needs torch.compile") as info:
        plan_run([f"trainer.run_dir={tmp_path / 'a'}", "trainer.activation_checkpointing=budget"])
    assert info.value.field == "trainer.activation_checkpointing" and "long_context, full or auto" in str(info.value)
    gpu = ["infra=runpod", "infra.gpu_type=NVIDIA H100 80GB HBM3", "infra.ship_data=false", "infra.gpus_per_node=8"]
    gpu += ["model=olmo3_1b", "data.seq_len=8192", "trainer.global_batch_size=8", "trainer.micro_batch_size=1"]
    none = plan_run([f"trainer.run_dir={tmp_path / 'b'}", *gpu])
    half = plan_run([f"trainer.run_dir={tmp_path / 'c'}", *gpu, "trainer.activation_checkpointing=budget"])
    assert half.execution.compile
    flops = dict(half.sections["time"])["FLOPs per token"]
    assert "(activation_checkpointing=budget, trainer.activation_memory_budget=0.5)" in flops
    assert "+ recompute" not in dict(none.sections["time"])["FLOPs per token"]
    peak_none, peak_half = (float(dict(p.sections["memory"])["estimated peak"].split()[0]) for p in (none, half))
    assert peak_half < peak_none

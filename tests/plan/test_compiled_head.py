"""The plan's output-layer term for compiled runs: OLMo-core compiles the LM head with the blocks,
and the compiled head keeps its logits in the compute dtype for backward, where the eager head
keeps two float32 logits-sized tensors (the loss's float32 input and log-softmax). Counted with
saved-tensor hooks on OLMo-core's LM head with its loss, as ``benchmarks/compiled_activations.py``
counts blocks, and compared with :data:`olmx.plan.memory.COMPILED_HEAD_LOGITS`."""

from __future__ import annotations

from olmx.plan.memory import COMPILED_HEAD_LOGITS

D, VOCAB, BATCH, SEQ = 128, 2048, 2, 96


def _logits_bytes_per_entry(compiled: bool) -> float:
    """Bytes per token and vocabulary entry the head keeps in tensors with a vocabulary dimension."""
    import torch

    from olmx.config.schema import ModelConfig
    from olmx.worker.model import build_model_config

    torch.manual_seed(0)
    config = ModelConfig(d_model=D, n_layers=1, n_heads=2, hidden_size=3 * D)
    head = build_model_config(config, vocab_size=VOCAB, attention="torch", seq_len=SEQ).build(init_device="cpu")
    head = head.lm_head.to(torch.bfloat16)
    torch._dynamo.reset()
    if compiled:  # the partitioner inductor uses, without generating code
        head.compile(fullgraph=False, backend="aot_eager_decomp_partition")
    params = {p.untyped_storage().data_ptr() for p in head.parameters()}
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if t.dim() and t.shape[-1] == VOCAB and s.data_ptr() not in params:
            kept[s.data_ptr()] = s.nbytes()
        return t

    x = torch.randn(BATCH, SEQ, D, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, VOCAB, (BATCH, SEQ))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = head(x, labels=labels, loss_reduction="sum", z_loss_multiplier=1e-5, loss_div_factor=BATCH * SEQ)
    out.loss.backward()
    torch._dynamo.reset()
    assert x.grad is not None and torch.isfinite(x.grad.float()).all()
    return sum(kept.values()) / (BATCH * SEQ * VOCAB)


def test_a_compiled_head_keeps_its_logits_in_the_compute_dtype() -> None:
    assert _logits_bytes_per_entry(compiled=False) == 8  # eager: two float32 copies (the plan's 2 x 4)
    assert _logits_bytes_per_entry(compiled=True) == COMPILED_HEAD_LOGITS * 2  # bf16 logits only

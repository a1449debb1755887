"""olmx's pipeline module without processes: a stage's initial weights are its part of the one
model of the seed (the training test, ``tests/plugins/parallel/test_pp.py``, compares whole runs)."""

from __future__ import annotations

import copy

import pytest
import torch

from olmx.worker.pipeline import OneModelInit, init_calls

N_LAYERS = 4


def whole_model():
    """A 4-block OLMo-core model on the meta device, as the worker builds it for a pipeline."""
    from olmo_core.nn.transformer import TransformerConfig

    config = TransformerConfig.llama_like(d_model=32, vocab_size=128, n_layers=N_LAYERS, n_heads=2, init_seed=7)
    return config.build(init_device="meta")


def stage(model, start: int, stop: int):
    """Blocks ``start..stop`` of ``model`` (with the embedding first, the head last), cut as
    OLMo-core's ``TransformerPipelineParallelConfig.split_model`` cuts a stage."""
    part = copy.deepcopy(model)
    if start:
        part.embeddings = None
    for i in range(N_LAYERS):
        if not start <= i < stop:
            del part.blocks[str(i)]
    if stop < N_LAYERS:
        part.lm_head = None
    return part


@pytest.mark.parametrize(
    "cuts",
    [[(0, 2), (2, 4)], [(0, 1), (1, 2), (2, 3), (3, 4)]],
    ids=["1F1B: 2 stages", "Interleaved1F1B: 4 stages"],
)
def test_each_stage_starts_from_its_part_of_the_one_model(cuts):
    """Every stage initialised through :class:`OneModelInit` (as OLMo-core's train module calls
    ``init_weights`` on it) holds exactly the weights of the same modules of the one model
    initialised whole at the same seed; without it (OLMo-core's own draw, which starts each
    stage's generator afresh) the stages after the first do not."""
    model = whole_model()
    one = copy.deepcopy(model)
    one.init_weights(device=torch.device("cpu"))
    want = dict(one.named_parameters())
    calls = init_calls(model)
    keys = [call.key for call in calls]
    assert keys[:3] == [("init_embeddings", None), ("init_attention", 0), ("init_feed_forward", 0)]
    assert next(model.parameters()).is_meta  # recording drew nothing and left the model as it was
    for start, stop in cuts:
        part = stage(model, start, stop)
        part.init_method = OneModelInit(part.init_method, calls, model.init_seed)
        part.init_weights(device=torch.device("cpu"))
        got = dict(part.named_parameters())
        assert got.keys() < want.keys()
        for name, p in got.items():
            assert torch.equal(p, want[name]), (start, stop, name)
        own = stage(model, start, stop)
        own.init_weights(device=torch.device("cpu"))
        same = all(torch.equal(p, want[name]) for name, p in own.named_parameters())
        assert same == (start == 0), (start, stop)

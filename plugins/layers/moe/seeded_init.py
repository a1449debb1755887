"""One seed, one initial model, whichever MoE backend (``layers.moe.backend``).

The portable MoE draws its own weights (:func:`.modules.seeded_rows`): row ``r`` of parameter
``name`` of the MoE in block ``i`` comes from a generator seeded with (``trainer.seed``, ``i``,
``name``, ``r``), however the parameter is sharded. OLMo-core's v1 MoE would draw its router
and experts from the model's one generator (``Transformer.init_weights``), in its own layout
and between the attention layers' draws: the same seed would build a different model, down to
the attention weights of every later block, and a GPU run (``olmo_core``) would not start
where its CPU rehearsal (``portable``) did.

So on the ``olmo_core`` backend the plugin gives the built model a :class:`PortableMoEInit` as
its ``init_method`` (the object ``init_weights`` calls for each part of the model, after
parallelism is applied). It hands every part to OLMo-core's own init method, except the MoE
layers: those it fills with the portable layer's weights, drawn as the portable layer draws
them and laid out as OLMo-core's v1 MoE holds them (the mapping of :mod:`.convert`), taking
nothing from the model's generator. Each rank draws only the experts whose rows it holds
(expert-parallel and FSDP shards), as the portable layer does.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.distributed.tensor import DTensor

from .modules import _local_row_ids, _seeded_trunc_normal_, seeded_rows

__all__ = ["PortableMoEInit", "init_v1_moe_like_portable_"]


@torch.no_grad()
def _fill_rows_(p: torch.Tensor, rows_per_unit: int, unit: Callable[[int], torch.Tensor]) -> None:
    """Fill ``p`` (plain or DTensor), whose dim 0 is consecutive blocks of ``rows_per_unit``
    rows, block ``e`` being ``unit(e)``; only the blocks this rank holds rows of are drawn."""
    local = p.to_local() if isinstance(p, DTensor) else p
    if local.numel() == 0 or local.is_meta:
        return
    ids = _local_row_ids(p)
    owner = ids // rows_per_unit
    out = torch.empty(local.shape, dtype=torch.float32)
    for e in owner.unique().tolist():
        sel = owner == e
        out[sel] = unit(e)[ids[sel] % rows_per_unit]
    local.copy_(out)


@torch.no_grad()
def init_v1_moe_like_portable_(m: Any, *, std: float, seed_key: str) -> None:
    """Fill OLMo-core's v1 MoE ``m`` (``MoEBase``) with the weights the portable layer keyed by
    ``seed_key`` (:meth:`~.block.MoEFeedForwardConfig.seed_key`) and ``std`` starts from, in
    v1's layout: router ``[E*d]`` (the portable ``[E, d]`` flat); dropless experts ``w1, w2, w3
    [E*h, d]`` (``w1``/``w3`` transposed per expert); capacity experts ``w1, w3 [E*d, h]``,
    ``w2 [E*h, d]``; the shared MLP as the portable shared expert (same layout)."""
    from olmo_core.nn.moe.mlp import DroplessMoEMLP

    if m.latent_down_proj is not None or m.latent_up_proj is not None:
        raise ValueError("latent MoE has no portable equivalent")
    d = m.router.d_model
    _fill_rows_(m.router.weight, d, lambda e: seeded_rows(f"{seed_key}.router.weight", [e], (d,), std=std)[0])
    mlp = m.experts.mlp
    h, dropless = mlp.hidden_size, isinstance(mlp, DroplessMoEMLP)
    for name in ("w1", "w2", "w3"):
        shape = (h, d) if name == "w2" else (d, h)  # one portable expert
        transpose = dropless and name != "w2"

        def unit(e: int, name: str = name, shape: tuple[int, int] = shape, transpose: bool = transpose) -> torch.Tensor:
            w = seeded_rows(f"{seed_key}.experts.{name}", [e], shape, std=std)[0]
            return w.T if transpose else w

        _fill_rows_(getattr(mlp, name), h if dropless or name == "w2" else d, unit)
    if m.shared_mlp is not None:
        for name in ("w1", "w2", "w3"):
            weight = getattr(m.shared_mlp, name).weight
            _seeded_trunc_normal_(weight, std=std, seed_key=f"{seed_key}.shared_expert.{name}.weight")


class PortableMoEInit:
    """A model's ``init_method`` that initialises OLMo-core v1 MoE layers as the portable layer
    (:func:`init_v1_moe_like_portable_`) and everything else with ``base`` (OLMo-core's
    ``InitMethod``), drawing as many numbers from the model's generator as the portable model
    does, so that both backends build the same model from one seed.

    :param base: The model's own init method.
    :param moe: The portable layer's config (``init_std``, ``init_seed``:
        :class:`~.block.MoEFeedForwardConfig`).
    """

    def __init__(self, base: Any, moe: Any):
        self.base = base
        self.moe = moe

    def __getattr__(self, name: str) -> Any:
        if name in ("base", "moe") or name.startswith("__"):  # not set yet (copy, unpickling)
            raise AttributeError(name)
        return getattr(self.base, name)

    def init_feed_forward_moe(self, m: Any, *, block_idx: int, **kwargs: Any) -> None:
        """The MoE of block ``block_idx`` as the portable layer: its own ``std`` and seed, nothing
        drawn from ``kwargs["generator"]`` (the portable MoE block takes nothing from it)."""
        del kwargs
        init_v1_moe_like_portable_(m, std=self.moe.init_std, seed_key=self.moe.seed_key(block_idx))

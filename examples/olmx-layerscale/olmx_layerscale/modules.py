"""LayerScale residual connection for OLMo-core blocks.

LayerScale (Touvron, Cord, Sablayrolles, Synnaeve, Jégou, "Going deeper with Image
Transformers", ICCV 2021, arXiv:2103.17239, §2) multiplies the output of each residual branch
by a learnable diagonal matrix before it is added to the residual stream:

    x_{l}' = x_l  + diag(λ_{l,1}, ..., λ_{l,d}) · SA(η(x_l))
    x_{l+1} = x_l' + diag(λ'_{l,1}, ..., λ'_{l,d}) · FFN(η(x_l'))

with every λ initialised to a small ε (0.1 up to depth 18, 1e-5 at 24, 1e-6 beyond), so each
block starts close to the identity and deep stacks train stably.

OLMo-core 3.0 routes both residual additions of its blocks through a
:class:`~olmo_core.nn.residual_stream.ResidualStream` module
(``residual + alpha * dropout(branch)``), in the pre-norm block (branch = ``attention(norm(x))``)
as in the reordered-norm block of OLMo 2/3 (branch = ``norm(attention(x))``). Replacing that
module with :class:`LayerScaleResidualStream` applies LayerScale to either block kind without
touching its ``forward``; the block's ``dropout`` and ``alpha`` are kept.
"""

from __future__ import annotations

import torch
from olmo_core.nn.residual_stream import ResidualStream
from torch import nn


class LayerScaleResidualStream(ResidualStream):
    """``residual + alpha * dropout(scale * branch)`` with a learnable per-channel ``scale``."""

    def __init__(
        self,
        d_model: int,
        *,
        init: float,
        alpha: float = 1.0,
        dropout: nn.Module | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__(alpha=alpha)
        if dropout is not None:
            self.dropout = dropout
        #: Value every scale is (re)set to by :meth:`reset_parameters`.
        self.init = init
        self.scale = nn.Parameter(torch.empty(d_model, device=device))
        self.reset_parameters()

    @classmethod
    def replacing(
        cls, stream: ResidualStream, d_model: int, *, init: float, device: torch.device | str | None = None
    ) -> LayerScaleResidualStream:
        """A LayerScale stream that keeps ``stream``'s ``alpha`` and dropout module."""
        return cls(d_model, init=init, alpha=stream.alpha, dropout=stream.dropout, device=device)

    def reset_parameters(self) -> None:
        """Set every scale to ``init``. OLMo-core's ``init_weights`` calls this after
        materialising a model built on the meta device (it uses no random generator)."""
        nn.init.constant_(self.scale, self.init)

    def forward(self, residual: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Add the scaled branch output ``x`` to ``residual``."""
        return torch.add(residual, self.dropout(x * self.scale.to(x.dtype)), alpha=self.alpha)

    def extra_repr(self) -> str:
        return f"d_model={self.scale.shape[0]}, init={self.init}, alpha={self.alpha}"

"""Checkpoint conversion between the MoE plugin's two paths (``layers.moe.backend``).

The portable path (olmx's ``MoEBlock``, MoE at ``blocks.<i>.moe``) and OLMo-core's v1 path
(``MoETransformerBlock``, MoE at ``blocks.<i>.feed_forward_moe``) hold the same layer in
different layouts. :func:`convert_model_state_dict` maps a whole model's state dict either
way (exactly, both directions); :func:`v1_state_dict_to_portable` and
:func:`portable_state_dict_to_v1` map one MoE layer's. Every other key (embeddings,
attention, norms, dense blocks, LM head) has the same name and layout in both models. Pure
tensor reshapes: no module is built.
"""

from __future__ import annotations

from typing import Literal

import torch

__all__ = [
    "PORTABLE_MOE_ATTR",
    "V1_MOE_ATTR",
    "convert_model_state_dict",
    "portable_state_dict_to_v1",
    "v1_state_dict_to_portable",
]


def v1_state_dict_to_portable(
    state_dict: dict[str, torch.Tensor],
    *,
    num_experts: int,
    d_model: int,
    hidden_size: int,
    dropless: bool,
) -> dict[str, torch.Tensor]:
    """Map the state dict of an OLMo-core v1 ``MoEBase`` (``feed_forward_moe``) to the portable
    layer (:class:`~.modules.MoEFeedForward`; experts ``w1, w3 [E, d, h]``, ``w2 [E, h, d]``).

    Keys are relative to the MoE module. OLMo-core v1 layouts (``nn/moe/{router,mlp}.py``):
    ``router.weight`` is flat ``[E*d]``; capacity ``MoEMLP`` stores ``w1, w3 [E*d, h]`` and
    ``w2 [E*h, d]``; ``DroplessMoEMLP`` stores ``w1, w2, w3 [E*h, d]`` (``w1``/``w3`` used
    transposed). Shared-MLP keys (``shared_mlp.w*.weight``) become ``shared_expert.w*.weight``
    unchanged (use ``shared_expert_mixing="olmo_core_v1"``); ``router.score_bias`` carries over.
    Latent-MoE checkpoints are not supported. :func:`portable_state_dict_to_v1` is the inverse.
    """
    E, d, h = num_experts, d_model, hidden_size
    out: dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        if key == "router.weight":
            out[key] = value.reshape(E, d)
        elif key == "router.score_bias":
            out[key] = value
        elif key.startswith("experts.mlp."):
            name = key.removeprefix("experts.mlp.")
            if dropless:
                w = value.reshape(E, h, d)
                out[f"experts.{name}"] = w if name == "w2" else w.transpose(1, 2).contiguous()
            else:
                out[f"experts.{name}"] = value.reshape(E, h, d) if name == "w2" else value.reshape(E, d, h)
        elif key.startswith("shared_mlp."):
            out["shared_expert." + key.removeprefix("shared_mlp.")] = value
        elif key.startswith("latent_"):
            raise ValueError(f"latent-MoE checkpoints are not supported ({key})")
        else:
            raise KeyError(f"unexpected OLMo-core v1 MoE key {key!r}")
    return out


def portable_state_dict_to_v1(state_dict: dict[str, torch.Tensor], *, dropless: bool) -> dict[str, torch.Tensor]:
    """Inverse of :func:`v1_state_dict_to_portable`: the portable layer's state dict (keys
    relative to the layer) in OLMo-core v1's ``MoEBase`` layout (``DroplessMoE`` when ``dropless``, else
    the capacity ``MoE``). The shapes are read off the tensors."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        if key in ("router.weight", "router.score_bias"):
            out[key] = value.reshape(-1) if key == "router.weight" else value
        elif key.startswith("experts."):
            name = key.removeprefix("experts.")
            w = value if name == "w2" or not dropless else value.transpose(1, 2)  # -> [E, h, d]
            out[f"experts.mlp.{name}"] = w.reshape(-1, w.shape[-1]).contiguous()
        elif key.startswith("shared_expert."):
            out["shared_mlp." + key.removeprefix("shared_expert.")] = value
        else:
            raise KeyError(f"unexpected portable MoE key {key!r}")
    return out


#: Sub-module of a block holding the MoE: OLMo-core v1's ``MoETransformerBlock`` and
#: olmx's portable ``MoEBlock``.
V1_MOE_ATTR, PORTABLE_MOE_ATTR = "feed_forward_moe", "moe"


def convert_model_state_dict(
    state_dict: dict[str, torch.Tensor],
    *,
    to: Literal["portable", "olmo_core_v1"],
    num_experts: int,
    d_model: int,
    hidden_size: int,
    dropless: bool,
) -> dict[str, torch.Tensor]:
    """A whole model's state dict between the two MoE paths (``to``: the target path).

    ``blocks.<i>.feed_forward_moe.*`` (OLMo-core v1 ``MoETransformer``) and ``blocks.<i>.moe.*``
    (olmx's portable blocks) are converted with :func:`v1_state_dict_to_portable` /
    :func:`portable_state_dict_to_v1`; every other key (embeddings, attention, norms, dense
    blocks, LM head) has the same name and layout in both models and is kept. The round trip
    is exact. The portable model must use ``shared_expert_mixing="olmo_core_v1"`` to compute
    what the v1 model computes when there is a shared expert.
    """
    src = V1_MOE_ATTR if to == "portable" else PORTABLE_MOE_ATTR
    dst = PORTABLE_MOE_ATTR if to == "portable" else V1_MOE_ATTR
    out: dict[str, torch.Tensor] = {}
    layers: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in state_dict.items():
        parts = key.split(".")
        if len(parts) > 3 and parts[0] == "blocks" and parts[2] == src:
            layers.setdefault(".".join(parts[:2]), {})[".".join(parts[3:])] = value
        else:
            out[key] = value
    for block, sd in layers.items():
        if to == "portable":
            sd = v1_state_dict_to_portable(
                sd, num_experts=num_experts, d_model=d_model, hidden_size=hidden_size, dropless=dropless
            )
        else:
            sd = portable_state_dict_to_v1(sd, dropless=dropless)
        out.update({f"{block}.{dst}.{k}": v for k, v in sd.items()})
    return out

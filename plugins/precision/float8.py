"""The torch side of ``fp8``: convert a built model's planned linear layers to torchao's
``Float8Linear`` (method and sources in :mod:`olmx_plugins.precision.fp8`).

On the GPU through OLMo-core's ``Transformer.apply_fp8(Float8Config(ao_recipe=...,
modules_to_ignore=...))``, the call ``parallelize_model`` makes for ``float8_config``; with
``emulate`` through torchao's ``convert_to_float8_training`` with the recipe's config and
``emulate=True`` (OLMo-core's recipes cannot emulate). Either way exactly the layers the plan
listed are converted, which is checked.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch.nn as nn

log = logging.getLogger(__name__)


def apply_float8(model: nn.Module, *, recipe: str, convert: list[str], emulate: bool) -> list[str]:
    """Swap the ``nn.Linear`` modules named in ``convert`` for ``Float8Linear``; return them."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    from torchao.float8.config import Float8LinearRecipeName
    from torchao.float8.float8_linear import Float8Linear

    wanted = set(convert)
    if emulate:
        config = dataclasses.replace(Float8LinearConfig.from_recipe_name(Float8LinearRecipeName(recipe)), emulate=True)
        convert_to_float8_training(model, config=config, module_filter_fn=lambda m, fqn: fqn in wanted)
        log.warning("precision=fp8 with emulate=true: torchao's emulated float8 is slow; it is for checking numerics")
    else:
        from olmo_core.float8 import AOFloat8LinearRecipe, Float8Config

        linears = {n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n != "lm_head.w_out"}
        ignore: Any = sorted(linears - wanted)
        model.apply_fp8(Float8Config(ao_recipe=AOFloat8LinearRecipe(recipe), modules_to_ignore=ignore))
    done = sorted(n for n, m in model.named_modules() if isinstance(m, Float8Linear))
    if done != sorted(wanted):
        raise RuntimeError(f"FP8 conversion mismatch: converted {done}, planned {sorted(wanted)}")
    log.info("FP8 (%s%s): %d linear layers converted", recipe, ", emulated" if emulate else "", len(done))
    return done

"""Plans of ``bf16`` and ``mxfp8`` (torch-free): hardware checks, refusals, layer lists, dtypes."""

from __future__ import annotations

import pytest

from olmx.api import World
from olmx.config.compose import compose, to_object
from olmx.errors import ConfigError
from olmx.plan.resolve import build_context
from olmx.registry import registry

CPU2 = World(nnodes=1, nproc_per_node=2)
H100 = World(nnodes=1, nproc_per_node=8, device="cuda", device_name="NVIDIA H100 80GB HBM3", compute_capability=(9, 0))
B200 = World(nnodes=1, nproc_per_node=8, device="cuda", device_name="NVIDIA B200", compute_capability=(10, 0))


def plan_rows_list(precision: str, world: World, *overrides: str) -> list[tuple[str, str]]:
    reg = registry()
    run = to_object(compose([f"precision={precision}", *overrides], reg), reg)
    return reg.get("precision", precision).resolve(run.precision[precision], build_context(run, world, reg)).rows


def plan_rows(precision: str, world: World, *overrides: str) -> dict[str, str]:
    return dict(plan_rows_list(precision, world, *overrides))


def refusal(precision: str, world: World, *overrides: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        plan_rows(precision, world, *overrides)
    return info.value


# -- bf16 -------------------------------------------------------------------------------------


def test_bf16_under_fsdp_is_the_fsdp_mixed_precision_policy():
    rows = plan_rows("bf16", CPU2, "parallel=[fsdp]")
    assert rows["master weights, optimizer state"] == "float32"
    assert rows["compute (all-gathered parameters)"] == "bfloat16"
    assert rows["gradient reduction (reduce-scatter)"] == "float32"
    assert "dp_config.param_dtype=bfloat16, reduce_dtype=float32" in rows["mechanism"]
    rows = plan_rows("bf16", CPU2, "parallel=[hsdp]", "precision.reduce_dtype=bfloat16")
    assert rows["gradient reduction (reduce-scatter)"] == "bfloat16"


def test_bf16_under_ddp_is_autocast_over_float32_parameters():
    rows = plan_rows("bf16", CPU2, "parallel=[ddp]")
    assert rows["master weights, optimizer state"] == "float32"
    assert rows["compute"].startswith("bfloat16")
    assert rows["gradients, reduction"] == "float32"
    assert "autocast" in rows["mechanism"]
    assert "slower than fp32" in rows["note"]


def test_bf16_refuses_bfloat16_reduction_without_sharding_and_unknown_dtypes():
    err = refusal("bf16", CPU2, "parallel=[ddp]", "precision.reduce_dtype=bfloat16")
    assert err.field == "precision.reduce_dtype" and "shards parameters (parallel=[fsdp]" in str(err)
    err = refusal("bf16", CPU2, "precision.param_dtype=float16")
    assert err.field == "precision.param_dtype" and "'float16' is not one of bfloat16, float32" in str(err)


# -- mxfp8: hardware --------------------------------------------------------------------------


def test_mxfp8_refuses_a_cpu_naming_it_and_what_is_needed():
    err = refusal("mxfp8", CPU2)
    assert err.field == "precision"
    assert "found CPU only (no CUDA GPU)" in str(err)
    assert "compute capability 10.0 or newer (SM100: B200, GB200, B300)" in str(err)
    assert "precision.emulate=true" in str(err)


def test_mxfp8_refuses_hopper_naming_the_device_and_its_compute_capability():
    err = refusal("mxfp8", H100, "parallel=[fsdp]")
    assert "found NVIDIA H100 80GB HBM3 (compute capability 9.0)" in str(err)


def test_mxfp8_on_sm100_uses_olmo_core_float8_config_with_real_kernels():
    rows = plan_rows("mxfp8", B200, "parallel=[fsdp]")
    assert rows["hardware"] == "NVIDIA B200 (compute capability 10.0)"
    assert "Float8Config(ao_mx=AOMXLinearConfig(kernel_preference=auto" in rows["kernels"]
    assert "scale_calculation_mode=rceil" in rows["kernels"]
    assert "warning" not in rows
    assert rows["compute outside MXFP8 layers (all-gathered parameters)"] == "bfloat16"


def test_mxfp8_emulation_runs_anywhere_and_says_it_is_slow():
    for world, parallel in ((CPU2, "[ddp]"), (H100, "[fsdp]")):
        rows = plan_rows("mxfp8", world, f"parallel={parallel}", "precision.emulate=true")
        assert rows["kernels"].startswith("EMULATED") and "slow" in rows["kernels"]
        assert "slow" in rows["warning"]


# -- mxfp8: which layers -----------------------------------------------------------------------


def kept(rows: list[tuple[str, str]], dtype: str) -> list[str]:
    return [value for label, value in rows if label == f"kept in {dtype}"]


def test_mxfp8_lists_converted_and_kept_layers_with_reasons():
    rows = plan_rows_list(
        "mxfp8",
        CPU2,
        "precision.emulate=true",
        "model.n_layers=3",
        "model.d_model=64",
        "model.n_heads=4",
        "model.n_kv_heads=1",
        "model.hidden_size=80",
    )
    # d_model 64: q/o are 64x64; GQA with 1 kv head of 16 dims: k/v are 64 -> 16; FFN 64 <-> 80.
    assert dict(rows)["MXFP8 linear layers"] == "6: blocks.*.attention.w_q (x3), blocks.*.attention.w_out (x3)"
    assert kept(rows, "float32") == [
        "blocks.*.attention.w_k (x3), blocks.*.attention.w_v (x3): out_features=16 not a multiple of the MX "
        "block size 32",
        "blocks.*.feed_forward.w1 (x3), blocks.*.feed_forward.w3 (x3): out_features=80 not a multiple of the MX "
        "block size 32",
        "blocks.*.feed_forward.w2 (x3): in_features=80 not a multiple of the MX block size 32",
        "lm_head.w_out: output head: its logits feed the softmax and loss (OLMo-core never converts it)",
    ]


def test_mxfp8_exclude_patterns_keep_layers():
    rows = plan_rows_list("mxfp8", B200, "parallel=[fsdp]", "precision.exclude=[blocks.0.*]")
    assert dict(rows)["MXFP8 linear layers"].startswith("21: blocks.*.attention.w_q (x3),")  # 4 blocks x 7 - 7
    assert kept(rows, "bfloat16")[0] == (
        "blocks.0.attention.w_q, blocks.0.attention.w_k, blocks.0.attention.w_v, blocks.0.attention.w_out, "
        "blocks.0.feed_forward.w1, blocks.0.feed_forward.w2, blocks.0.feed_forward.w3: "
        "precision.exclude matches 'blocks.0.*'"
    )


def test_mxfp8_refuses_d_model_not_divisible_by_32():
    err = refusal("mxfp8", B200, "parallel=[fsdp]", "model.d_model=48", "model.n_heads=4")
    assert err.field == "model.d_model"
    assert "48 is not a multiple of the MX block size 32" in str(err)
    assert "could convert none of them" in str(err)


def test_mxfp8_refuses_micro_batches_whose_tokens_are_not_blocks_of_32():
    err = refusal(
        "mxfp8", B200, "parallel=[fsdp]", "data.seq_len=20", "trainer.micro_batch_size=1", "trainer.global_batch_size=8"
    )
    assert err.field == "trainer.micro_batch_size"
    assert "trainer.micro_batch_size=1 x data.seq_len=20 = 20 tokens" in str(err)


# -- mxfp8: the rest of the model ------------------------------------------------------------


def test_mxfp8_other_ops_default_to_float32_on_cpu_without_sharding_and_bf16_under_fsdp():
    rows = plan_rows("mxfp8", CPU2, "parallel=[ddp]", "precision.emulate=true")
    assert rows["compute outside MXFP8 layers"] == "float32 (no autocast)"
    rows = plan_rows("mxfp8", CPU2, "parallel=[fsdp]", "precision.emulate=true")
    assert rows["compute outside MXFP8 layers (all-gathered parameters)"] == "bfloat16"
    err = refusal("mxfp8", CPU2, "parallel=[ddp]", "precision.emulate=true", "precision.param_dtype=bfloat16")
    assert err.field == "precision.param_dtype" and "CPU autocast" in str(err)


def test_sequence_parallel_degrees_divide_the_tokens_a_linear_layer_sees():
    reg = registry()
    run = to_object(
        compose(
            [
                "parallel=[fsdp,ulysses]",
                "parallel.ulysses.degree=2",
                "trainer.micro_batch_size=2",
                "data.seq_len=48",
                "trainer.global_batch_size=4",
            ],
            reg,
        ),
        reg,
    )
    ctx = build_context(run, World(nnodes=1, nproc_per_node=4), reg)
    assert ctx.mesh.cp == 2
    assert ctx.tokens_per_rank() == (48, "trainer.micro_batch_size=2 x data.seq_len=48 / context-parallel degree 2")


HALF = '''"""A third-party precision plugin that chooses float16, which olmx does not apply."""
from dataclasses import dataclass

from olmx.api import Dtypes, PrecisionPlugin


@dataclass(frozen=True)
class HalfConfig:
    """Settings of ``precision``."""

    #: Reduce in float16 too.
    half_reduce: bool = False


class Half(PrecisionPlugin):
    name = "half"
    api = ">=3.0,<4"
    Config = HalfConfig

    def dtypes(self, cfg, run, world, mesh):
        return Dtypes(param="bfloat16" if cfg.half_reduce else "float16",
                      reduce="bfloat16" if cfg.half_reduce else "float32")


HALF = Half()
'''


def test_a_plugins_unsupported_dtypes_are_refused_naming_the_plugin_not_a_field_it_lacks(plugin_site):
    from olmx.plan.resolve import plan_from_overrides
    from olmx.registry import Registry
    from tests.conftest import make_dist

    make_dist(plugin_site, "olmx-half", "[olmx.precision]\nhalf = half_mod:HALF\n", {"half_mod": HALF})
    reg = Registry.discover()
    with pytest.raises(ConfigError) as info:
        plan_from_overrides(["precision=half"], reg)
    assert info.value.field == "precision"  # the plugin has no param_dtype field to name
    assert "the precision plugin 'half' chose param dtype 'float16'" in str(info.value)
    assert "is not one of bfloat16, float32" in str(info.value)
    with pytest.raises(ConfigError) as info:
        plan_from_overrides(["precision=half", "precision.half_reduce=true", "parallel=[ddp]"], reg)
    assert info.value.field == "precision"
    assert "the precision plugin 'half' chose reduce dtype 'bfloat16'" in str(info.value)
    assert "shards parameters" in str(info.value)

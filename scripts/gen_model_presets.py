"""Write conf/model/olmo3_*.yaml from OLMo-core 3.0.0's own TransformerConfig.olmo3_* presets.

Run: python scripts/gen_model_presets.py. tests/build/test_model.py checks that olmx builds
exactly OLMo-core's config from each file, so a drift in either shows up there.
"""

from __future__ import annotations

from pathlib import Path

PRESETS = ["14M", "30M", "60M", "100M", "190M", "370M", "600M", "760M", "1B", "3B", "7B", "13B", "32B"]
OUT = Path(__file__).resolve().parents[1] / "conf" / "model"


def fields(preset: str) -> dict:
    from olmo_core.nn.transformer import TransformerConfig

    cfg = getattr(TransformerConfig, f"olmo3_{preset}")(vocab_size=100352)
    block = cfg.block
    att = block.sequence_mixer
    sw = att.sliding_window
    return {
        "name": f"olmo3_{preset.lower()}",
        "d_model": cfg.d_model,
        "n_layers": cfg.n_layers,
        "n_heads": att.n_heads,
        "n_kv_heads": att.n_kv_heads,
        "hidden_size": block.feed_forward.hidden_size,
        "block": str(block.name),
        "qk_norm": att.qk_norm is not None,
        "rope_theta": att.rope.theta,
        "layer_norm_eps": block.layer_norm.eps,
        "sliding_window": list(sw.pattern) if sw is not None else None,
        "attn_backend": "auto",
        "init_std": cfg.init_std,
    }


def main() -> None:
    import yaml

    for preset in PRESETS:
        data = fields(preset)
        text = (
            f"# OLMo 3 {preset}: generated from OLMo-core 3.0.0's TransformerConfig.olmo3_{preset} by\n"
            "# scripts/gen_model_presets.py (tests/build/test_model.py checks they agree).\n"
        )
        (OUT / f"{data['name']}.yaml").write_text(text + yaml.safe_dump(data, sort_keys=False))
        print("wrote", data["name"])


if __name__ == "__main__":
    main()

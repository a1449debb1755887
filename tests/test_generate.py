"""``olmx generate``: continuations from checkpoints, loaded into one process whatever the run's
world was (FSDP on 2 processes, sharded Engram tables), greedy and sampled."""

from __future__ import annotations

from pathlib import Path

import pytest

from olmx.errors import ConfigError
from olmx.generate import Sampling, generate
from tests.conftest import olmx_cli
from tests.test_training import train

pytestmark = pytest.mark.dist
PATTERN = "abcdefgh"


def _files(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def pattern_run(tmp_path_factory) -> Path:
    """A tiny model trained with FSDP on 2 processes on a repeated 8-letter pattern."""
    root = tmp_path_factory.mktemp("generate")
    corpus = root / "abc.txt"
    corpus.write_text(PATTERN * 4000)
    run = root / "run"
    cache = {"OLMX_CACHE_DIR": str(root / "cache")}
    overrides = ["data=text", f"data.paths=[{corpus}]", "parallel=[fsdp]", "infra.nproc_per_node=2"]
    train(run, cache, *overrides, "trainer.max_steps=30", "trainer.save_interval=15")
    return run


def test_greedy_continues_the_learned_pattern_from_an_fsdp_checkpoint_and_writes_nothing(pattern_run) -> None:
    before = _files(pattern_run)
    proc = olmx_cli(
        "generate", str(pattern_run), "--prompt", "abcdefghabc", "--temperature", "0", "--max-new-tokens", "21"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "abcdefghabc" + "defghabcdefghabcdefgh"
    assert "checkpoint step 30" in proc.stderr and "Traceback" not in proc.stderr
    assert _files(pattern_run) == before


def test_sampling_is_seeded_and_a_tiny_nucleus_is_greedy(pattern_run) -> None:
    greedy, step = generate(pattern_run, "abcd", Sampling(max_new_tokens=12, temperature=0))
    assert step == 30
    assert generate(pattern_run, "abcd", Sampling(max_new_tokens=12, temperature=1.0, top_p=1e-6))[0] == greedy
    hot = Sampling(max_new_tokens=24, temperature=5.0, seed=7)
    first = generate(pattern_run, "abcd", hot)[0]
    assert generate(pattern_run, "abcd", hot)[0] == first  # same seed, same text
    assert first != generate(pattern_run, "abcd", Sampling(max_new_tokens=24, temperature=5.0, seed=8))[0]
    assert generate(pattern_run, "abcd", Sampling(max_new_tokens=4, temperature=0), step=15)[1] == 15


@pytest.mark.parametrize(
    ("call", "key", "match"),
    [
        (dict(sampling=Sampling(top_p=0)), "--top-p", r"in \(0, 1\]"),
        (dict(sampling=Sampling(temperature=-1)), "--temperature", "0 \\(greedy\\) or more"),
        (dict(sampling=Sampling(max_new_tokens=0)), "--max-new-tokens", "at least 1"),
        (dict(step=7), "--step", r"not a complete checkpoint; complete ones: \[15, 30\]"),
        (dict(prompt=""), "--prompt", "is empty"),
    ],
)
def test_bad_options_name_their_option(pattern_run, call, key, match) -> None:
    args = {"prompt": "abc", "sampling": Sampling(), **call}
    with pytest.raises(ConfigError, match=match) as info:
        generate(pattern_run, args.pop("prompt"), args.pop("sampling"), **args)
    assert info.value.field == key


def test_engram_with_sharded_tables_and_moe_generate_in_one_process(tmp_path) -> None:
    run = tmp_path / "run"
    cache = {"OLMX_CACHE_DIR": str(tmp_path / "cache")}
    train(
        run, cache, "layers=[engram,moe]", "layers.engram.sharding=1d", "infra.nproc_per_node=2", "trainer.max_steps=2"
    )
    greedy = Sampling(max_new_tokens=16, temperature=0)
    text, step = generate(run, "def main(", greedy)
    assert step == 2 and len(text) <= 16  # at most 16 bytes, each at most one character
    assert generate(run, "def main(", greedy)[0] == text
    missing = tmp_path / "nothing-here"
    proc = olmx_cli("generate", str(missing), "--prompt", "x")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert not missing.exists()

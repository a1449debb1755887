"""Fuzz of the plan's data inspection: token files (raw and ``np.save``'d) and ``tokenizer.json``
files mutated at random (bytes flipped, cut short, grown, headers overwritten, JSON values of
the wrong type or removed) are read as the plan reads them and end as facts or as one
``ConfigError`` naming the field, never another exception. The seed is printed;
``OLMX_FUZZ_SEED`` replays it."""

from __future__ import annotations

import json
import os
import random
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from tests.fuzzing import REPLACEMENTS, read_or_refuse, replaced, value_paths

SEED = int(os.environ.get("OLMX_FUZZ_SEED", random.randrange(2**32)))
MUTATIONS = int(os.environ.get("OLMX_FUZZ_EXAMPLES", "300"))


def _mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    kind = rng.choice(["flip", "cut", "grow", "head", "empty"])
    if kind == "flip":
        out = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            out[rng.randrange(len(out))] = rng.randrange(256)
        return bytes(out)
    if kind == "cut":
        return data[: rng.randrange(len(data))]
    if kind == "grow":
        return data + bytes(rng.randrange(256) for _ in range(rng.randint(1, 9)))
    if kind == "head":
        n = rng.randint(1, 160)
        return bytes(rng.randrange(256) for _ in range(n)) + data[n:]
    return b""


def test_mutated_token_files_are_facts_or_one_config_error(tmp_path) -> None:
    from olmx.data.files import inspect_token_file

    print(f"fuzz seed {SEED} (replay: OLMX_FUZZ_SEED={SEED})")
    rng = random.Random(SEED)
    ids = np.random.default_rng(0).integers(0, 500, 20_000)
    ids.astype(np.uint16).tofile(tmp_path / "raw.bin")
    np.save(tmp_path / "saved.npy", ids.astype(np.int32).reshape(100, 200))
    bases = [(tmp_path / "raw.bin").read_bytes(), (tmp_path / "saved.npy").read_bytes()]
    seen = {"facts": 0, "refused": 0}
    for i in range(MUTATIONS):
        path = tmp_path / f"m{i % 2}.{'npy' if i % 2 else 'bin'}"
        path.write_bytes(_mutate_bytes(bases[i % 2], rng))
        read_or_refuse(partial(inspect_token_file, path, 500), "data.paths", seen, (SEED, i))
    print(seen)
    assert seen["refused"] > 0 and seen["facts"] > 0


def _tokenizer_json(tmp_path: Path) -> dict:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>", "<|pad|>"])
    tok.train_from_iterator(["def main(argv):\n    return 0\n" * 20, "hello world " * 30], trainer)
    tok.save(str(tmp_path / "tokenizer.json"))
    return json.loads((tmp_path / "tokenizer.json").read_text())


def test_mutated_tokenizer_files_are_facts_or_one_config_error(tmp_path) -> None:
    pytest.importorskip("tokenizers")
    from olmx.data.tokenizer import read_tokenizer_json

    print(f"fuzz seed {SEED} (replay: OLMX_FUZZ_SEED={SEED})")
    rng = random.Random(SEED)
    base = _tokenizer_json(tmp_path)
    text = json.dumps(base)
    spots = list(value_paths(base, max_items=20))
    path = tmp_path / "m" / "tokenizer.json"
    path.parent.mkdir()
    seen = {"facts": 0, "refused": 0}
    for i in range(MUTATIONS):
        if i % 3 == 0:  # the text itself: cut, or a character replaced
            cut = rng.randrange(len(text))
            mutated = text[:cut] if rng.random() < 0.5 else text[:cut] + rng.choice('{}[]",:0a') + text[cut + 1 :]
        else:  # one value of the parsed file replaced by another type, or removed
            mutated = json.dumps(replaced(base, rng.choice(spots), rng.choice(REPLACEMENTS)))
        path.write_text(mutated)
        read_or_refuse(lambda: read_tokenizer_json(path), "data.tokenizer.path", seen, (SEED, i))
    print(seen)
    assert seen["refused"] > 0 and seen["facts"] > 0

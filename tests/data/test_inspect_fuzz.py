"""Fuzz of the plan's data inspection: token files (raw and ``np.save``'d) and ``tokenizer.json``
files mutated at random (bytes flipped, cut short, grown, headers overwritten, JSON values of
the wrong type or removed) are read as the plan reads them and end as facts or as one
``ConfigError`` naming the field, never another exception. The seed is printed;
``OLMX_FUZZ_SEED`` replays it."""

from __future__ import annotations

import copy
import json
import os
import random
from pathlib import Path

import numpy as np
import pytest

from olmx.errors import ConfigError

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
        try:
            inspect_token_file(path, 500)
            seen["facts"] += 1
        except ConfigError as exc:
            assert exc.field == "data.paths" and "\n" not in str(exc), (SEED, i, str(exc))
            seen["refused"] += 1
        except Exception as exc:
            raise AssertionError(f"fuzz seed {SEED}, mutation {i}: {type(exc).__name__}: {exc}") from exc
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


def _paths(data, path=()):
    if isinstance(data, dict):
        for key, value in data.items():
            yield (*path, key)
            yield from _paths(value, (*path, key))
    elif isinstance(data, list):
        for i, value in enumerate(data[:20]):
            yield (*path, i)
            yield from _paths(value, (*path, i))


def test_mutated_tokenizer_files_are_facts_or_one_config_error(tmp_path) -> None:
    pytest.importorskip("tokenizers")
    from olmx.data.tokenizer import read_tokenizer_json

    print(f"fuzz seed {SEED} (replay: OLMX_FUZZ_SEED={SEED})")
    rng = random.Random(SEED)
    base = _tokenizer_json(tmp_path)
    text = json.dumps(base)
    spots = list(_paths(base))
    path = tmp_path / "m" / "tokenizer.json"
    path.parent.mkdir()
    seen = {"facts": 0, "refused": 0}
    for i in range(MUTATIONS):
        if i % 3 == 0:  # the text itself: cut, or a character replaced
            cut = rng.randrange(len(text))
            mutated = text[:cut] if rng.random() < 0.5 else text[:cut] + rng.choice('{}[]",:0a') + text[cut + 1 :]
        else:  # one value of the parsed file replaced by another type, or removed
            data = copy.deepcopy(base)
            spot = rng.choice(spots)
            parent = data
            for key in spot[:-1]:
                parent = parent[key]
            new = rng.choice([None, 0, -1, 1.5, "x", [], {}, True, 10**12, "DELETE"])
            if new == "DELETE":
                del parent[spot[-1]]
            else:
                parent[spot[-1]] = new
            mutated = json.dumps(data)
        path.write_text(mutated)
        try:
            read_tokenizer_json(path)
            seen["facts"] += 1
        except ConfigError as exc:
            assert exc.field == "data.tokenizer.path" and "\n" not in str(exc), (SEED, i, str(exc))
            seen["refused"] += 1
        except Exception as exc:
            raise AssertionError(f"fuzz seed {SEED}, mutation {i}: {type(exc).__name__}: {exc}") from exc
    print(seen)
    assert seen["refused"] > 0 and seen["facts"] > 0

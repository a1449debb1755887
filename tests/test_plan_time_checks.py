"""The plan-time catalogue: every mistake that can be known before launch ends in one line naming
the field, exit code 2, no traceback, and nothing written (no run directory, the token cache
untouched), through ``olmx train --dry-run`` and through ``olmx train``, the real launch path;
and ``olmx run`` on a plan.yaml it cannot read.

In-process (``CliRunner``): ``olmx train`` resolves the plan before it writes or starts
anything, so an in-process call takes the same path as a subprocess; one subprocess checks
``olmx run`` end to end.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from olmx.cli import app
from tests.conftest import olmx_cli

#: A ``data=numpy`` run over a 500-id vocabulary (OLMo-core reads uint16), 4 sequences of 64
#: tokens per step over the default 2 processes.
NUMPY = [
    "data=numpy",
    "data.tokenizer.vocab_size=500",
    "data.tokenizer.eos_id=499",
    "data.tokenizer.pad_id=498",
    "data.seq_len=64",
    "trainer.global_batch_size=4",
    "trainer.micro_batch_size=2",
]
TEXT = ["data=text", "data.seq_len=64"]


def make_files(d: Path) -> None:
    """The corpora the catalogue names as ``{d}/...``."""
    d.mkdir()
    rng = np.random.default_rng(0)
    good = rng.integers(0, 500, 20_000)
    good.astype(np.uint16).tofile(d / "good.bin")
    np.save(d / "good.npy", good.astype(np.int64))
    np.save(d / "float.npy", good.astype(np.float32))
    np.save(d / "fortran.npy", np.asfortranarray(good.reshape(200, 100)))
    (d / "truncated.npy").write_bytes((d / "good.npy").read_bytes()[:-2000])
    bad = good.copy()
    bad[123] = 600
    bad.astype(np.uint16).tofile(d / "big_id.bin")
    bad[123] = 70_000
    np.save(d / "big_id.npy", bad)
    bad[123] = -1
    np.save(d / "negative.npy", bad)
    good.astype(np.int64).tofile(d / "int64_raw.bin")
    good.astype(np.int32).tofile(d / "int32_raw.bin")
    (d / "odd.bin").write_bytes(b"\1" * 1001)
    (d / "one_byte.bin").write_bytes(b"\1")
    (d / "empty.bin").write_bytes(b"")
    good[:100].astype(np.uint16).tofile(d / "small.bin")  # 1 sequence of 64; a step needs 4
    (d / "shards").mkdir()
    (d / "empty.txt").write_text("")
    (d / "one.txt").write_text("x")
    (d / "short.txt").write_text("y" * 1000)  # 1,001 tokens: 15 sequences of 64; a step needs 16


#: (overrides, environment, field, text); ``{d}`` is the directory of :func:`make_files`,
#: ``{cache}`` the token cache (``$OLMX_CACHE_DIR``, not there before).
CATALOGUE = [
    # data=numpy: headers, sizes, dtypes, ids
    ([*NUMPY, "data.paths=[{d}/float.npy]"], {}, "data.paths", "holds float32 values, not integer token ids"),
    ([*NUMPY, "data.paths=[{d}/fortran.npy]"], {}, "data.paths", "Fortran-ordered 2-D array"),
    ([*NUMPY, "data.paths=[{d}/truncated.npy]"], {}, "data.paths", "truncated: its header announces 20,000 int64"),
    (
        [*NUMPY, "data.paths=[{d}/big_id.bin]"],
        {},
        "data.paths",
        "holds token id 600 at position 123 (in a sample of its ids), outside the vocabulary [0, "
        "data.tokenizer.vocab_size=500)",
    ),
    ([*NUMPY, "data.paths=[{d}/big_id.npy]"], {}, "data.paths", "holds token id 70000 at position 123"),
    (
        [*NUMPY, "data.tokenizer.vocab_size=100278", "data.paths=[{d}/good.bin]"],
        {},
        "data.paths",
        "outside the vocabulary [0, data.tokenizer.vocab_size=100278); OLMo-core reads raw token files as uint32",
    ),
    ([*NUMPY, "data.paths=[{d}/negative.npy]"], {}, "data.paths", "holds token id -1 at position 123"),
    ([*NUMPY, "data.paths=[{d}/int64_raw.bin]"], {}, "data.paths", "looks like 64-bit integers written raw"),
    ([*NUMPY, "data.paths=[{d}/int32_raw.bin]"], {}, "data.paths", "looks like 32-bit integers written raw"),
    ([*NUMPY, "data.paths=[{d}/odd.bin]"], {}, "data.paths", "has 1,001 bytes, not a whole number of uint16"),
    ([*NUMPY, "data.paths=[{d}/one_byte.bin]"], {}, "data.paths", "has 1 bytes, not a whole number of uint16"),
    ([*NUMPY, "data.paths=[{d}/empty.bin]"], {}, "data.paths", "the corpus is empty"),
    (
        [*NUMPY, "data.paths=[{d}/small.bin]"],
        {},
        "data.paths",
        "the corpus (100 tokens) makes 1 sequence(s) of data.seq_len=64; one optimizer step needs "
        "trainer.global_batch_size=4 sequences = 256 tokens",
    ),
    ([*NUMPY, "data.paths=[{d}/shards]"], {}, "data.paths", "shards' is a directory; name its files, e.g. "),
    ([*NUMPY, "data.paths=[{d}/*]"], {}, "data.paths", "is a directory"),
    (
        [*NUMPY, "data.paths=[{d}/good.bin]", "data.seq_len=50000"],
        {},
        "data.seq_len",
        "50,000 tokens per sequence is longer than every file of the corpus (the longest holds 20,000 tokens",
    ),
    (
        [*NUMPY, "data.paths=[{d}/good.npy]"],
        {"OLMX_CACHE_DIR": "/etc/hostname/cache"},
        "OLMX_CACHE_DIR",
        "'/etc/hostname/cache' cannot be created: '/etc/hostname' is not a directory",
    ),
    (
        [*NUMPY, "data.paths=[{d}/good.npy]", "data.cache_dir=/proc/olmx-cache"],
        {},
        "data.cache_dir",
        "'/proc/olmx-cache' cannot be created: '/proc' is not writable (",
    ),
    # data=text / stdlib: sizes, the cache, the byte-level vocabulary
    ([*TEXT, "data.paths=[{d}/empty.txt]"], {}, "data.paths", "the corpus is empty: its files hold no bytes"),
    (
        [*TEXT, "data.paths=[{d}/one.txt]"],
        {},
        "data.seq_len",
        "64 tokens per sequence is longer than the corpus (2 byte-level tokens)",
    ),
    (
        [*TEXT, "data.paths=[{d}/short.txt]"],
        {},
        "data.paths",
        "makes 15 sequence(s) of data.seq_len=64; one optimizer step needs trainer.global_batch_size=16",
    ),
    ([*TEXT, "data.paths=[{d}/shards]"], {}, "data.paths", "is a directory"),
    (["data.seq_len=1000000000"], {}, "data.seq_len", "must be an integer in [2, 1,048,576], got 1000000000"),
    (["data.cache_dir=/etc/hostname/c"], {}, "data.cache_dir", "'/etc/hostname' is not a directory"),
    # where nothing can be created, even by root (os.access says yes there; the workers died)
    ([], {"OLMX_CACHE_DIR": "/proc/olmx-cache"}, "OLMX_CACHE_DIR", "'/proc' is not writable"),
    (["trainer.run_dir=/proc/olmx-run"], {}, "trainer.run_dir", "'/proc/olmx-run' cannot be created: '/proc'"),
    (
        ["data.tokenizer.vocab_size=256", "data.tokenizer.pad_id=0", "data.tokenizer.eos_id=1"],
        {},
        "data.tokenizer.vocab_size",
        "[257, 65,536]",
    ),
    (["data.tokenizer.eos_id=10"], {}, "data.tokenizer.eos_id", "10 is a byte (0-255) in data=stdlib"),
    (["data.tokenizer.bos_id=999"], {}, "data.tokenizer.bos_id", "outside the vocabulary [0, 258)"),
    (["data.num_workers=-1"], {}, "data.num_workers", ">= 0"),
    # trainer
    (["trainer.lr=nan"], {}, "trainer.lr", "must be a positive finite number, got nan"),
    (["trainer.lr=inf"], {}, "trainer.lr", "must be a positive finite number, got inf"),
    (["trainer.lr=0"], {}, "trainer.lr", "must be a positive finite number, got 0.0"),
    (["trainer.weight_decay=-0.1"], {}, "trainer.weight_decay", "must be a finite number >= 0, got -0.1"),
    (["trainer.weight_decay=nan"], {}, "trainer.weight_decay", "got nan"),
    (["trainer.max_grad_norm=0"], {}, "trainer.max_grad_norm", "positive finite number or null"),
    (["trainer.z_loss=-1"], {}, "trainer.z_loss", ">= 0 or null"),
    # data settings, checked before anything is derived from them (the held-out split divides by seq_len)
    (["data.seq_len=0"], {}, "data.seq_len", "must be an integer in [2, 1,048,576], got 0"),
    (["data.seq_len=1", "eval.holdout_sequences=null"], {}, "data.seq_len", "an integer in [2, 1,048,576], got 1"),
    # model
    (
        ["model.d_model=7", "model.n_heads=1"],
        {},
        "model.d_model",
        "model.d_model=7 / model.n_heads=1 makes heads of 7 dimensions; OLMo-core's RoPE rotates pairs",
    ),
    (["model.init_std=0"], {}, "model.init_std", "positive finite"),
    # what the workers refused (OLMo-core's seed_all, its sliding-window config): refused by the plan
    (["trainer.seed=-1"], {}, "trainer.seed", "must be an integer in [0, 4,294,967,295], got -1"),
    (
        ["model.sliding_window=[0]"],
        {},
        "model.sliding_window",
        "must be each a positive integer or -1, or null, got [0]",
    ),
    # switches take true or false (OmegaConf read 2 and yes as true), the core's and a plugin's
    (["model.qk_norm=2"], {}, "model.qk_norm", "'2' is not one of true, false"),
    (["precision=mxfp8", "precision.emulate=yes"], {}, "precision.emulate", "'yes' is not one of true, false"),
    # a mapping of single values (the environment of a job) takes no list or mapping
    (
        ["infra=slurm", "infra.env.X=[0,1]"],
        {},
        "infra.env.X",
        "must be a single value (a string, number or bool), got [0, 1]",
    ),
    # interpolations that do not resolve, and what Hydra's grammar reads only inside quotes
    (
        ["trainer.run_dir=${{oc.env:OLMX_UNSET_41}}/x"],
        {},
        "trainer.run_dir",
        "environment variable OLMX_UNSET_41 is not set (${oc.env:OLMX_UNSET_41}); export it, or give a default: "
        "${oc.env:OLMX_UNSET_41,DEFAULT}",
    ),
    (["trainer.run_dir=${{nope}}/x"], {}, "trainer.run_dir", "Interpolation key 'nope' not found"),
    (
        ["trainer.run_dir=/tmp/ü/x"],
        {},
        "trainer.run_dir",
        "'/tmp/ü/x' has characters Hydra's override grammar reads only inside quotes; quote the value: "
        """'trainer.run_dir="/tmp/ü/x"'""",
    ),
    (["data.paths=[/tmp/ü]"], {}, "data.paths", """quote each item: 'data.paths=["/tmp/ü"]'"""),
    # duplicates in list-selected groups (Hydra would keep one)
    (["parallel=[ddp,ddp]"], {}, "parallel", "'ddp' is listed twice in parallel=[ddp,ddp]; list each plugin once"),
    (["layers=[moe,moe]"], {}, "layers", "'moe' is listed twice in layers=[moe,moe]"),
    (["layers=[engram, moe, engram]"], {}, "layers", "'engram' is listed twice"),
    (["precision=[fp32,fp32]"], {}, "precision", "a run has one precision: precision=NAME, not a list"),
    (["infra=[local]"], {}, "infra", "a run has one infra: infra=NAME, not a list"),
]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("corpora") / "d"
    make_files(d)
    return d


@pytest.mark.parametrize(
    ("args", "env", "field", "text"), CATALOGUE, ids=[" ".join(a[-2:]) + " ".join(e) for a, e, _, _ in CATALOGUE]
)
@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "train"])
def test_refused_at_plan_time(tmp_path, monkeypatch, files, args, env, field, text, dry_run):
    work, cache = tmp_path / "work", tmp_path / "cache"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("OLMX_CACHE_DIR", str(cache))
    for key, value in env.items():
        monkeypatch.setenv(key, value.format(d=files))
    before = sorted(p.name for p in files.iterdir())
    overrides = [a.format(d=files) for a in args]
    result = CliRunner().invoke(app, ["train", *(["--dry-run"] if dry_run else []), *overrides])
    assert result.exit_code == 2, result.output
    message = result.stderr.strip()
    assert message.count("\n") == 0, message
    assert message.startswith(f"error: {field}: "), message
    assert text in message, message
    assert "Traceback" not in result.output
    assert list(work.iterdir()) == []  # no run directory
    assert not cache.exists()  # the cache untouched
    assert sorted(p.name for p in files.iterdir()) == before


def test_catalogue_size():
    assert len(CATALOGUE) >= 40


def plan_for(*overrides: str):
    from olmx.plan.resolve import plan_from_overrides
    from olmx.registry import registry

    reg = registry()
    return plan_from_overrides(list(overrides), reg)


def test_good_files_pass_and_the_plan_says_how_they_are_read(tmp_path, monkeypatch, files):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OLMX_CACHE_DIR", str(tmp_path / "cache"))
    paths = f"data.paths=[{files}/good.bin,{files}/good.npy]"
    rows = dict(plan_for(*NUMPY, paths).sections["data"])
    assert rows == {
        "corpus": "2 file(s) (1 raw uint16, 1 np.save'd int64), 40,000 tokens",
        "np.save'd files": f"read through their header, copied once as raw uint16 into {tmp_path / 'cache'}",
        # 2 x (20,000 // 64) sequences, 4 a step; the default 200 steps run 1.28 epochs
        "sequences": "624 x 64 tokens = 156 steps per epoch (trainer.max_steps=200 repeats the data 1.28 times)",
        "evaluation": "every 50 steps and at step 200: loss and perplexity of 32 sequences of the held-out "
        "slice (8 batch(es) of 4)",
        "held out": "32 sequences x 64 tokens = 2,048 tokens from the end of the training data, never trained on",
    }
    result = CliRunner().invoke(app, ["train", "--dry-run", *NUMPY, paths])
    assert result.exit_code == 0, result.output
    assert "np.save'd" in result.stdout
    assert list(tmp_path.iterdir()) == []  # nothing written, the cache not even created


def test_init_from_without_the_hf_extra_is_refused_by_the_plan(tmp_path, monkeypatch):
    """model.init_from where transformers is not installed (simulated: the import finder finds
    none): one line naming the extra, before anything is written; the worker would need it."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "transformers" else real(name, *a)
    )
    (tmp_path / "hf").mkdir()
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    result = CliRunner().invoke(app, ["train", f"model.init_from={tmp_path / 'hf'}"])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == (
        "error: model.init_from: needs the transformers package, which is not installed: pip install 'olmx[hf]'"
    )
    assert list(work.iterdir()) == []


def test_a_warmup_longer_than_the_run_is_a_plan_warning(tmp_path, monkeypatch):
    """Short smoke runs keep a recipe's warm-up: a warning in the plan, not a refusal."""
    monkeypatch.chdir(tmp_path)
    plan = plan_for("trainer.max_steps=5", "trainer.warmup_steps=20")
    assert plan.sections["warnings"] == [
        (
            "warm-up",
            "trainer.warmup_steps=20 is longer than the run (trainer.max_steps=5): the learning rate only "
            "reaches 0.00075 of trainer.lr=0.003, and trainer.schedule=cosine never starts",
        )
    ]
    assert "warnings" not in plan_for("trainer.max_steps=50").sections
    result = CliRunner().invoke(app, ["train", "--dry-run", "trainer.max_steps=5", "trainer.warmup_steps=20"])
    assert result.exit_code == 0 and "warm-up" in result.stdout


# ---- olmx run on a plan.yaml it cannot read ----------------------------------------------------


def _saved_plan(tmp_path: Path) -> Path:
    from datetime import datetime

    from olmx.plan.resolve import plan_from_overrides
    from olmx.registry import registry

    reg = registry()
    plan = plan_from_overrides([f"trainer.run_dir={tmp_path / 'run'}"], reg, now=datetime(2026, 1, 1))
    return plan.save()


def bad_plans(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """name -> (path, what the error says)."""
    good = _saved_plan(tmp_path)
    text = good.read_text()
    cases = {
        "missing": (tmp_path / "nope" / "plan.yaml", "does not exist (olmx train writes RUN_DIR/plan.yaml)"),
        "directory": (tmp_path, "is a directory, not a plan.yaml"),
        "empty": (tmp_path / "empty.yaml", "is empty; write it again with olmx train"),
        "binary": (tmp_path / "binary.yaml", "is not a text file"),
        "control characters": (tmp_path / "ctl.yaml", "is not valid YAML (unacceptable character"),
        "truncated mid-line": (tmp_path / "cut1.yaml", "is not valid YAML"),
        "truncated at a line": (tmp_path / "cut2.yaml", "is truncated (it ends before olmx_version, its last key)"),
        "a list": (tmp_path / "list.yaml", "holds a list, not a plan"),
        "wrong type": (tmp_path / "type.yaml", "can read: world.nnodes: expected int, got str 'two'"),
        "unknown plugin": (tmp_path / "plugin.yaml", "no-such-strategy"),
    }
    cases["empty"][0].write_text("")
    cases["binary"][0].write_bytes(bytes(range(256)) * 4)
    cases["control characters"][0].write_bytes(b"config:\x00\x01 nothing\n")
    lines = text.splitlines(keepends=True)
    cases["truncated mid-line"][0].write_text(text[: text.index("\nworld:") + 4] + "{[")
    cases["truncated at a line"][0].write_text("".join(lines[: len(lines) // 2]))
    cases["a list"][0].write_text("- 1\n- 2\n")
    data = yaml.safe_load(text)
    data["world"]["nnodes"] = "two"
    cases["wrong type"][0].write_text(yaml.safe_dump(data, sort_keys=False))
    data = yaml.safe_load(text)
    data["config"]["parallel"] = {"no-such-strategy": {}}
    cases["unknown plugin"][0].write_text(yaml.safe_dump(data, sort_keys=False))
    return cases


@pytest.mark.filterwarnings("ignore:Unable to enable fault handler")  # CliRunner's stderr has no fileno
def test_olmx_run_on_a_bad_plan_is_one_line(tmp_path, monkeypatch):
    cases = bad_plans(tmp_path)
    for key in ("OLMO_DISABLE_PER_RANK_TRITON_CACHE", "OLMO_SHARED_FS"):  # the worker sets them
        monkeypatch.setenv(key, os.environ.get(key, "1"))
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for name, (path, text) in cases.items():
            result = CliRunner().invoke(app, ["run", str(path)])
            message = result.stderr.strip()
            assert result.exit_code == 2, (name, result.output, result.exception)
            assert message.count("\n") == 0 and "Traceback" not in result.output, (name, message)
            field = "PLAN" if name != "unknown plugin" else ""
            assert message.startswith(f"error: {field}"), (name, message)
            assert text in message, (name, message)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["plan.yaml"]  # nothing else written


def test_olmx_run_on_a_missing_plan_in_a_real_process(tmp_path):
    proc = olmx_cli("run", str(tmp_path / "plan.yaml"))
    assert proc.returncode == 2, proc.stderr
    assert (
        proc.stderr.strip()
        == f"error: PLAN: '{tmp_path / 'plan.yaml'}' does not exist (olmx train writes RUN_DIR/plan.yaml)"
    )
    assert "Traceback" not in proc.stdout + proc.stderr and list(tmp_path.iterdir()) == []


def test_a_saved_plan_still_loads(tmp_path):
    from olmx.plan import Plan

    path = _saved_plan(tmp_path)
    assert Plan.load(path).run_dir == str(tmp_path / "run")

"""A catalogue of user mistakes: each ends in one message naming the field, exit code 2, no
traceback, and nothing written."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from olmx.cli import app

CATALOGUE = [
    (["model=nope"], "model", "unknown option 'nope'"),
    (["data=nope"], "data", "allowed: numpy, stdlib, text"),
    (["parallel=[zero3]"], "parallel", "unknown option 'zero3'"),
    (["precision=fp4"], "precision", "unknown option 'fp4'; did you mean 'fp8'?"),
    (["infra=k8s"], "infra", "allowed: local"),
    (["experiment=nope"], "experiment", "unknown option 'nope'; allowed: "),
    (["trainer.stepz=5"], "trainer.stepz", "unknown key 'stepz' of trainer; allowed: activation_checkpointing, "),
    (["trainer.max_stepz=5"], "trainer.max_stepz", "unknown key 'max_stepz' of trainer; did you mean 'max_steps'?"),
    (["experiment=olmo3_7bb"], "experiment", "unknown option 'olmo3_7bb'; did you mean 'olmo3_7b'?"),
    (["+trainer.max_steps=5"], "trainer.max_steps", "already exists"),
    (["trainer.max_steps=abc"], "trainer.max_steps", "could not be converted to Integer"),
    (["trainer.max_steps=0"], "trainer.max_steps", "positive"),
    (["trainer.lr=-1"], "trainer.lr", "positive"),
    (["trainer.lr=1e-3,3e-4"], "trainer.lr", "sweep"),
    (
        ["trainer.global_batch_size=15"],
        "trainer.global_batch_size",
        "multiple of trainer.micro_batch_size (8) x data-parallel ranks (2) = 16",
    ),
    (["trainer.micro_batch_size=0"], "trainer.micro_batch_size", "positive"),
    (["trainer.schedule=step"], "trainer.schedule", "cosine, linear, constant"),
    (["trainer.betas=[0.9]"], "trainer.betas", "must be 2 numbers, each a number in [0, 1), got [0.9]"),
    (["trainer.optimizer=sgd"], "trainer.optimizer", "skip_step_adamw, adamw"),
    (["trainer.compile=true"], "trainer.compile", "OLMo-core 3.0.0 applies torch.compile only where CUDA"),
    (["trainer.activation_checkpointing=partial"], "trainer.activation_checkpointing", "full"),
    (["trainer.run_dir=/etc/hostname/run"], "trainer.run_dir", "not a directory"),
    (["data=text"], "data.paths", "data=text needs at least one file: data.paths=[path/to/file,...]"),
    (["data=text", "data.paths=[/nonexistent/corpus.txt]"], "data.paths", "does not exist"),
    (["data=numpy", "data.paths=[/nonexistent/*.npy]"], "data.paths", "does not exist"),
    (["data.seq_len=1"], "data.seq_len", "an integer in [2, 1,048,576], got 1"),
    (["data.tokenizer.eos_id=999"], "data.tokenizer.eos_id", "outside the vocabulary [0, 258)"),
    (["data.tokenizer.name=llama"], "data.tokenizer.name", "unknown tokenizer 'llama'; allowed: bytes, dolma2,"),
    (["data.tokenizer=gpt_neox"], "data.tokenizer.name", "did you mean 'gpt_neox_olmo_dolma_v1_5'? data=stdlib"),
    (
        ["data.tokenizer=gpt2"],
        "data.tokenizer.name",
        "OLMo-core's tokenizer 'gpt2' (gpt2) has no tokenizer.json on this machine, and olmx never downloads",
    ),
    (["data.name=web"], "data.name", "stdlib, text, numpy"),
    (["model.n_heads=3"], "model.n_heads", "must divide model.d_model=128"),
    (["model.n_kv_heads=3"], "model.n_kv_heads", "divide model.n_heads=4"),
    (["model.block=fancy"], "model.block", "default, reordered_norm"),
    (["model.attn_backend=xformers"], "model.attn_backend", "auto, torch"),
    (["parallel=[]"], "parallel", "2 processes need a data-parallel strategy"),
    (["parallel=[ddp,fsdp]"], "parallel", "choose one data-parallel strategy"),
    (
        ["parallel=[fsdp]", "parallel.fsdp.wrapping_strategy=weird"],
        "parallel.fsdp.wrapping_strategy",
        "full, blocks, fine_grained",
    ),
    (["+parallel.ddp.bucket_mb=3"], "parallel.ddp.bucket_mb", "unknown key"),
    (["precision=bf16", "precision.param_dtype=fp8"], "precision.param_dtype", "bfloat16, float32"),
    # single-choice groups are flat; plugin keys name what is allowed or what to select
    (
        ["precision=mxfp8", "precision.mxfp8.emulate=true"],
        "precision.mxfp8.emulate",
        "precision is one flat section: write precision=mxfp8 precision.emulate=VALUE",
    ),
    (["precision.emulate=true"], "precision.emulate", "set by precision=fp8 or mxfp8; select one to set it"),
    (
        ["layers=[moe]", "layers.moe.topk=2"],
        "layers.moe.topk",
        "key 'topk' of layers.moe; did you mean 'top_k'?",
    ),
    (["layers.moe.top_k=2"], "layers.moe.top_k", "moe is not selected; add it: layers=[...,moe]"),
    (["layers.mo.top_k=2"], "layers.mo.top_k", "unknown layer plugin 'mo'; did you mean 'moe'?"),
    (["infra.nproc_per_node=0"], "infra.nproc_per_node", "a positive integer or null, got 0"),
    (["infra.node_rank=3"], "infra.node_rank", "[0, infra.nnodes=1)"),
    (["--cfg", "job"], "--cfg", "not an olmx option"),
]


@pytest.mark.parametrize(("args", "field", "text"), CATALOGUE, ids=[" ".join(a) for a, _, _ in CATALOGUE])
@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "train"])
def test_bad_input_gives_one_clear_message(tmp_path, monkeypatch, args, field, text, dry_run):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["train", *(["--dry-run"] if dry_run else []), *args])
    assert result.exit_code == 2, result.output
    message = result.stderr.strip()
    assert message.count("\n") == 0, message
    assert message.startswith(f"error: {field}: "), message
    assert text in message
    assert "Traceback" not in result.output
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_catalogue_is_large_enough():
    assert len(CATALOGUE) >= 25


def test_broken_selected_plugin_is_reported_by_name(tmp_path, monkeypatch, plugin_site):
    from tests.conftest import make_dist

    make_dist(
        plugin_site,
        "olmx-broken",
        "[olmx.layers]\nbroken = broken_mod:PLUGIN\n",
        {"broken_mod": "import not_installed_dependency\n"},
    )
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["train", "--dry-run", "layers=[broken]"])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: layers: plugin 'broken' from olmx-broken is broken: ModuleNotFoundError")
    # the rest of the CLI is unaffected
    assert CliRunner().invoke(app, ["train", "--dry-run"]).exit_code == 0

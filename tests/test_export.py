"""``olmx export hf|torch`` and ``model.init_from``: an olmx checkpoint as a Hugging Face
``transformers`` directory (Llama, OLMo 2, OLMo 3; with MoE layers OLMoE and FlexOlmo) whose
logits and greedy continuation are olmx's, and a run started from such a directory, on one
process and with FSDP on two."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from olmx.errors import ConfigError
from tests.conftest import olmx_cli
from tests.test_training import SMALL

#: Largest |logit difference| allowed between olmx's model and its transformers export, both in
#: float32 on the same CPU (measured: 0.0, the same kernels compute the same sums).
LOGIT_TOL = 1e-5
#: The run started from an export begins within this fraction of the exported run's last loss.
RESUME_TOL = 0.02
#: ``model.*`` settings of each transformers architecture (3 layers: OLMo 3's pattern [16,-1]
#: makes layer 0 sliding, layers 1 and 2 full).
ARCHS = {
    "llama": [],
    "olmo2": ["model.block=reordered_norm", "model.qk_norm=true"],
    "olmo3": ["model.block=reordered_norm", "model.qk_norm=true", "model.sliding_window=[16,-1]"],
}
TINY = ["model.d_model=64", "model.n_layers=3", "model.n_heads=4", "model.n_kv_heads=2", "model.hidden_size=256"]


def plan_for(tmp_path: Path, *overrides: str):
    """The resolved plan of a tiny one-process run (nothing is written)."""
    from olmx.plan.resolve import plan_from_overrides
    from olmx.registry import registry

    reg = registry()
    args = [*TINY, "data.seq_len=64", "infra.nproc_per_node=1", "parallel=[]", f"data.cache_dir={tmp_path / 'cache'}"]
    args += [f"trainer.run_dir={tmp_path / 'run'}", *overrides]
    return plan_from_overrides(args, reg)


def built(plan, seed: int):
    """The plan's model on the CPU, initialised from ``seed``, its norm gains moved off 1 (so
    that a norm mapped to the wrong place shows)."""
    import torch

    from olmx.worker.model import build_model_config

    model = build_model_config(plan.run.model, vocab_size=plan.vocab_size).build(init_device="cpu")
    torch.manual_seed(seed)
    model.init_weights(device=torch.device("cpu"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


@pytest.fixture
def hf_offline(monkeypatch):
    """What :func:`olmx.worker.hf.offline` sets, restored after the test."""
    for key in ("HF_HUB_OFFLINE", "HF_HUB_DISABLE_TELEMETRY", "HF_HUB_DISABLE_PROGRESS_BARS"):
        monkeypatch.setenv(key, "1")
    from olmx.worker.hf import offline

    offline()


@pytest.fixture
def llama_dir(tmp_path, hf_offline) -> Path:
    """A Llama export of a built tiny model (no training), for the plan's init_from checks."""
    from olmx.worker.hf import save_hf

    plan = plan_for(tmp_path / "export")
    save_hf(built(plan, 0), plan, "llama", tmp_path / "llama")
    return tmp_path / "llama"


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_each_architecture_exports_and_loads_back_exactly(tmp_path, hf_offline, arch) -> None:
    import torch
    from olmo_core.nn.hf import load_hf_model
    from transformers import AutoModelForCausalLM

    from olmx.plan.hf import ARCHITECTURES, check_init_from, hf_architecture
    from olmx.worker.hf import save_hf

    plan = plan_for(tmp_path, *ARCHS[arch])
    assert hf_architecture(plan.run) == arch
    model = built(plan, 0)
    out = tmp_path / "hf"
    assert save_hf(model, plan, arch, out) == len(model.state_dict())
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == arch and config["architectures"] == [ARCHITECTURES[arch][0]]
    assert (config["vocab_size"], config["eos_token_id"], config["pad_token_id"]) == (384, 256, 257)
    assert json.loads((out / "generation_config.json").read_text())["suppress_tokens"] == list(range(258, 384))

    hf = AutoModelForCausalLM.from_pretrained(out).eval()
    x = torch.randint(0, 258, (2, 48), generator=torch.Generator().manual_seed(1))  # longer than the window
    with torch.no_grad():
        diff = (model(x) - hf(x).logits).abs().max().item()
    assert diff <= LOGIT_TOL

    # The plan's torch-free check accepts the export, and OLMo-core's loader (the worker's) puts
    # back exactly the weights.
    run = dataclasses.replace(plan.run, model=dataclasses.replace(plan.run.model, init_from=str(out)))
    (row,) = check_init_from(run, plan.vocab_size, None)
    assert ARCHITECTURES[arch][0] in row[1] and f"{len(model.state_dict())} tensors" in row[1]
    other = built(plan, 1)
    state = other.state_dict()
    load_hf_model(str(out), state)
    other.load_state_dict(state)
    mine, theirs = other.state_dict(), model.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)


@pytest.mark.parametrize(
    ("overrides", "key", "match"),
    [
        (["layers=[moe]"], "layers", r"layers=\[moe\] add blocks that no Hugging Face transformers architecture"),
        (["layers=[engram]"], "layers", "olmx export torch writes the full state dict"),
        (["model.qk_norm=true"], "model.qk_norm", "Llama has no QK-norm"),
        (["model.sliding_window=[16,-1]"], "model.sliding_window", "Llama has no sliding-window attention"),
        (["model.block=reordered_norm"], "model.qk_norm", "normalise queries and keys in every layer"),
        (
            [*ARCHS["olmo3"][:2], "model.n_layers=4", "model.sliding_window=[16,32,-1]"],
            "model.sliding_window",
            r"windows of \[16, 32\] tokens",
        ),
    ],
)
def test_models_without_a_transformers_architecture_are_refused_with_the_reason(tmp_path, overrides, key, match):
    from olmx.plan.hf import hf_architecture

    with pytest.raises(ConfigError, match=match) as info:
        hf_architecture(plan_for(tmp_path, *overrides).run)
    assert info.value.field == key


def test_a_local_tokenizer_json_is_what_the_export_copies(tmp_path) -> None:
    from types import SimpleNamespace

    from olmx.export import _tokenizer_file

    def plan(name: str, path: str | None):
        tokenizer = SimpleNamespace(name=name, path=path)
        return SimpleNamespace(run=SimpleNamespace(data=SimpleNamespace(tokenizer=tokenizer)))

    (tmp_path / "tokenizer.json").write_text("{}")
    assert _tokenizer_file(plan("bytes", None)) is None and _tokenizer_file(plan("dolma2", None)) is None
    assert _tokenizer_file(plan("dolma2", str(tmp_path / "tokenizer.json"))) == tmp_path / "tokenizer.json"
    with pytest.raises(ConfigError, match="is not a file") as info:
        _tokenizer_file(plan("dolma2", str(tmp_path / "missing.json")))
    assert info.value.field == "data.tokenizer.path"


def _edit_copy(src: Path, dst: Path, *, config=None, tensors=None) -> Path:
    """A copy of an HF directory with its config.json or its tensors edited."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    if config is not None:
        data = json.loads((dst / "config.json").read_text())
        config(data)
        (dst / "config.json").write_text(json.dumps(data))
    if tensors is not None:
        state = load_file(dst / "model.safetensors")
        tensors(state)
        save_file(state, dst / "model.safetensors")
    return dst


def test_init_from_is_checked_at_plan_time(tmp_path, llama_dir) -> None:
    import torch

    def refused(path, *overrides: str) -> str:
        with pytest.raises(ConfigError) as info:
            plan_for(tmp_path, f"model.init_from={path}", *overrides)
        assert info.value.field == "model.init_from"
        return str(info.value)

    plan = plan_for(tmp_path, f"model.init_from={llama_dir}")
    row, export = plan.sections["model"]
    assert export == ("export hf", "LlamaForCausalLM (olmx export hf RUN_DIR --out DIR)")
    loads = f"{llama_dir}: LlamaForCausalLM (llama), 30 tensors, {plan.params.total:,} parameters (F32), loaded"
    assert row[1].startswith(loads)
    # A Hub model id is a missing directory here: refused, never looked up.
    assert "nothing is downloaded" in refused("allenai/OLMo-2-0425-1B")
    assert "holds a 'llama' model, and this run's model is olmo2" in refused(llama_dir, *ARCHS["olmo2"])
    assert "intermediate_size 256 in config.json, 128 in olmx's model (model.hidden_size)" in refused(
        llama_dir, "model.hidden_size=128"
    )
    assert "vocab_size 384 in config.json, 512" in refused(llama_dir, "data.tokenizer.vocab_size=400")
    remote = _edit_copy(llama_dir, tmp_path / "remote", config=lambda c: c.update(auto_map={"AutoConfig": "x.C"}))
    assert "runs no code from a checkpoint directory" in refused(remote)
    gone = _edit_copy(llama_dir, tmp_path / "gone", tensors=lambda s: s.pop("model.norm.weight"))
    assert "missing: model.norm.weight" in refused(gone)
    wide = _edit_copy(
        llama_dir,
        tmp_path / "wide",
        tensors=lambda s: s.update({"model.layers.0.mlp.up_proj.weight": torch.zeros(256, 65)}),
    )
    assert "other shapes: model.layers.0.mlp.up_proj.weight [256, 65] (olmx's model: [256, 64])" in refused(wide)
    pickled = tmp_path / "pickled"
    shutil.copytree(llama_dir, pickled)
    (pickled / "model.safetensors").rename(pickled / "pytorch_model.bin")
    assert "safetensors format only" in refused(pickled)
    cut = tmp_path / "cut"  # a copy cut short behind its intact header (an interrupted download)
    shutil.copytree(llama_dir, cut)
    weights = cut / "model.safetensors"
    whole = weights.stat().st_size
    with open(weights, "r+b") as f:
        f.truncate(whole - 1000)
    assert "is truncated: its header describes" in refused(cut)
    # Without the hf extra the worker could not load it: refused at plan time, naming the extra.
    import importlib.util

    real = importlib.util.find_spec

    def without_transformers(name, *args):
        return None if name == "transformers" else real(name, *args)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(importlib.util, "find_spec", without_transformers)
        assert "needs the transformers package, which is not installed: pip install 'olmx[hf]'" in refused(llama_dir)


def _losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def _train(run: Path, cache: Path, *overrides: str) -> str:
    proc = olmx_cli("train", *SMALL, f"trainer.run_dir={run}", *overrides, env={"OLMX_CACHE_DIR": str(cache)})
    log = run / "logs" / "node0.log"
    assert proc.returncode == 0, proc.stdout + proc.stderr + (log.read_text()[-3000:] if log.exists() else "")
    return proc.stdout


@pytest.fixture(scope="module")
def exported(tmp_path_factory, reference_run) -> dict[str, Path]:
    """The session's reference run (a tiny Llama-architecture model, 2 processes, DDP, 12 steps)
    exported both ways by the CLI."""
    root = tmp_path_factory.mktemp("export")
    # --out under folders that do not exist yet: they are made
    paths = {"run": reference_run, "hf": root / "new" / "hf", "pt": root / "model.pt", "cache": root / "cache"}
    proc = olmx_cli("export", "hf", str(paths["run"]), "--out", str(paths["hf"]))
    assert proc.returncode == 0, proc.stderr
    assert "LlamaForCausalLM, checkpoint step 12, 21 tensors" in proc.stdout
    assert "tokenizer.json: byte-level (ids 0-255 are UTF-8 bytes; <|endoftext|> 256, <|pad|> 257)" in proc.stdout
    from olmx.export import export_torch

    assert export_torch(paths["run"], paths["pt"]).tensors == 21
    return paths


@pytest.mark.dist
def test_the_export_has_olmx_logits_and_greedy_continuation(exported, hf_offline) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from olmx.generate import Sampling, decode, generate
    from olmx.local_model import choose_checkpoint, load_model, one_process
    from olmx.plan.resolve import local_plan
    from olmx.registry import registry

    assert sorted(p.name for p in exported["hf"].iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    hf = AutoModelForCausalLM.from_pretrained(exported["hf"]).eval()
    prompt = "def main(argv):\n    "
    ids = torch.tensor([list(prompt.encode())])
    reg = registry()
    plan = local_plan(exported["run"], reg)
    with one_process(plan):
        model = load_model(plan, reg, choose_checkpoint(exported["run"], None)).eval()
        with torch.no_grad():
            diff = (model(ids) - hf(ids).logits).abs().max().item()
        state = model.state_dict()
    assert diff <= LOGIT_TOL
    saved = torch.load(exported["pt"], weights_only=True)
    assert saved.keys() == state.keys() and all(torch.equal(saved[k], v) for k, v in state.items())

    ours, step = generate(exported["run"], prompt, Sampling(max_new_tokens=24, temperature=0))
    with torch.no_grad():
        theirs = hf.generate(ids, max_new_tokens=24, do_sample=False)[0, ids.shape[1] :].tolist()
    assert step == 12 and ours == decode(plan, [t for t in theirs if t != 256])
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(exported["hf"])  # byte-level, as olmx encodes
    assert tok(prompt)["input_ids"] == ids[0].tolist() and tok.eos_token_id == 256

    # Never over files olmx did not write; a missing checkpoint names --step.
    proc = olmx_cli("export", "hf", str(exported["run"]), "--out", str(exported["hf"]))
    assert proc.returncode == 2 and "exists and is not empty" in proc.stderr and "Traceback" not in proc.stderr
    from olmx.export import export_torch

    with pytest.raises(ConfigError, match="exists: export writes a new file") as info:
        export_torch(exported["run"], exported["pt"])
    assert info.value.field == "--out"
    with pytest.raises(ConfigError, match=r"not a complete checkpoint; complete ones: \[4, 8, 12\]") as info:
        export_torch(exported["run"], exported["pt"].with_suffix(".7"), step=7)
    assert info.value.field == "--step" and not exported["pt"].with_suffix(".7").exists()


@pytest.mark.dist
def test_init_from_the_export_starts_where_the_run_ended_on_fsdp_and_one_process(exported, tmp_path) -> None:
    start = [f"model.init_from={exported['hf']}", "trainer.max_steps=2"]
    fsdp = tmp_path / "fsdp"
    printed = _train(fsdp, exported["cache"], *start, "parallel=[fsdp]", "trainer.micro_batch_size=2")
    assert "LlamaForCausalLM (llama), 21 tensors" in printed
    single = tmp_path / "single"
    _train(single, exported["cache"], *start, "infra.nproc_per_node=1", "parallel=[]")
    ended, fresh = _losses(exported["run"])[-1], _losses(exported["run"])[0]
    first = _losses(fsdp)[0]
    assert abs(first - ended) <= RESUME_TOL * ended, (first, ended)
    assert first < fresh - 0.5  # not the random initialisation's loss
    assert _losses(fsdp) == pytest.approx(_losses(single), rel=2e-5)
    events = [json.loads(line) for line in (fsdp / "events.jsonl").read_text().splitlines()]
    assert [e.get("init_from") for e in events if e["event"] == "start"] == [str(exported["hf"])]


@pytest.mark.dist
def test_any_model_exports_to_torch_and_a_layered_one_is_refused_for_hf(tmp_path) -> None:
    import torch

    run, cache = tmp_path / "run", tmp_path / "cache"
    _train(run, cache, "layers=[engram,moe]", "infra.nproc_per_node=1", "parallel=[]", "trainer.max_steps=1")
    out = tmp_path / "hf"
    proc = olmx_cli("export", "hf", str(run), "--out", str(out))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "layers=[...,engram] adds blocks that no Hugging Face transformers architecture has" in proc.stderr
    assert not out.exists()
    proc = olmx_cli("export", "torch", str(run), "--out", str(tmp_path / "model.pt"))
    assert proc.returncode == 0, proc.stderr
    state = torch.load(tmp_path / "model.pt", weights_only=True)
    assert any("engram" in k for k in state) and any("experts" in k or "moe" in k for k in state)
    assert all(isinstance(v, torch.Tensor) and v.device.type == "cpu" for v in state.values())


def test_out_is_a_new_real_path_olmx_can_write(tmp_path) -> None:
    """--out is checked before anything is loaded: a symbolic link (followed, the export landed
    elsewhere and the rename failed with a traceback), a parent where nothing can be created."""
    from olmx.export import _check_out

    (tmp_path / "empty").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "empty")
    with pytest.raises(ConfigError, match="is a symbolic link: export writes a new directory") as info:
        _check_out(tmp_path / "link", directory=True)
    assert info.value.field == "--out"
    with pytest.raises(ConfigError, match="'/proc' is not writable"):
        _check_out(Path("/proc/model.pt"), directory=False)
    assert _check_out(tmp_path / "empty", directory=True) == tmp_path / "empty"
    # folders that do not exist yet are made when the export is written (not when checked)
    assert _check_out(tmp_path / "new" / "folders" / "hf", directory=True) == tmp_path / "new" / "folders" / "hf"
    assert not (tmp_path / "new").exists()
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="is not a directory"):
        _check_out(tmp_path / "file" / "hf", directory=True)


@pytest.mark.dist
def test_an_export_killed_at_random_instants_is_redone_by_the_next(exported, tmp_path) -> None:
    """Fault injection: ``olmx export hf`` SIGKILLed at random instants of its duration (the seed
    is printed; ``OLMX_FAULT_SEED`` replays it), then run again to the same ``--out``: the rerun
    succeeds with the uninterrupted export's files, and the killed one's partial copy is gone. An
    export whose final rename came before its kill is whole and is not written over."""
    import os
    import random
    import subprocess
    import time

    from tests.conftest import OLMX

    seed = int(os.environ.get("OLMX_FAULT_SEED", random.randrange(2**32)))
    print(f"fault seed {seed}")
    rng = random.Random(seed)
    reference = {p.name: p.read_bytes() for p in exported["hf"].iterdir()}
    start = time.monotonic()
    assert olmx_cli("export", "hf", str(exported["run"]), "--out", str(tmp_path / "whole")).returncode == 0
    duration = time.monotonic() - start
    for k in range(2):
        out = tmp_path / f"killed{k}"
        proc = subprocess.Popen([*OLMX, "export", "hf", str(exported["run"]), "--out", str(out)])
        at = rng.uniform(0.5, 1.0) * duration
        time.sleep(at)
        proc.kill()
        proc.wait()
        finished = out.exists()
        rerun = olmx_cli("export", "hf", str(exported["run"]), "--out", str(out))
        if finished:
            # The kill came after the export's final rename (a startup faster than the timed
            # one): its export is whole, and a second export to the same --out refuses it.
            assert rerun.returncode == 2 and "exists and is not empty" in rerun.stderr, (seed, at)
        else:
            assert rerun.returncode == 0, (seed, at, rerun.stderr)
        assert {p.name: p.read_bytes() for p in out.iterdir()} == reference, (seed, at)
        assert not [p.name for p in tmp_path.iterdir() if ".olmx-export-" in p.name], (seed, at)


#: MoE settings of each transformers MoE architecture (``layers=[moe]``, experts in every block).
MOE_ARCHS = {
    "OlmoeForCausalLM": ["model.qk_norm=true"],
    "FlexOlmoForCausalLM": ["model.block=reordered_norm", "model.qk_norm=true"],
}
MOE = ["layers=[moe]", "layers.moe.num_experts=4", "layers.moe.top_k=2"]


@pytest.mark.parametrize(
    ("overrides", "key", "match"),
    [
        (["layers.moe.every=2"], "layers.moe.every", r"experts in blocks \[1\] of 3: OLMoE and FlexOlmo have them"),
        (["layers.moe.shared_hidden_size=64"], "layers.moe.shared_hidden_size", "no shared expert"),
        (["layers.moe.gating=sigmoid"], "layers.moe.gating", "softmax over the experts"),
        (["layers.moe.capacity_factor=1.25"], "layers.moe.capacity_factor", "route every token"),
        (["layers.moe.normalize_expert_weights=2.0"], "layers.moe.normalize_expert_weights", "summing to one"),
        (["model.qk_norm=false"], "model.qk_norm", "normalise queries and keys"),
        (["model.sliding_window=[16,-1]"], "model.sliding_window", "whole context in every layer"),
        (["layers=[moe,engram]"], "layers", r"layers=\[...,engram\] adds blocks"),
    ],
)
def test_moe_models_without_a_transformers_architecture_are_refused_with_the_reason(tmp_path, overrides, key, match):
    from olmx.export import _hf_target
    from olmx.registry import registry

    plan = plan_for(tmp_path, *MOE, *MOE_ARCHS["OlmoeForCausalLM"], *overrides)
    with pytest.raises(ConfigError, match=match) as info:
        _hf_target(plan, registry())
    assert info.value.field == key


def test_the_plan_says_what_export_hf_will_make_of_the_run_as_the_export_decides(tmp_path) -> None:
    from olmx.export import _hf_target
    from olmx.registry import registry

    refused = plan_for(tmp_path, *MOE)  # OLMoE normalises queries and keys
    row = dict(refused.sections["model"])["export hf"]
    assert row.startswith("refused: model.qk_norm: OLMoE and FlexOlmo normalise queries and keys")
    assert "model.qk_norm=true makes it one" in row
    with pytest.raises(ConfigError) as info:
        _hf_target(refused, registry())
    assert row == f"refused: {info.value} (olmx export torch writes any model)"  # one source
    for cls, settings in MOE_ARCHS.items():
        assert dict(plan_for(tmp_path, *MOE, *settings).sections["model"])["export hf"].startswith(cls)
    engram = dict(plan_for(tmp_path, "layers=[engram]").sections["model"])["export hf"]
    assert engram.startswith("refused: layers: layers=[...,engram] adds blocks") and engram.count("export torch") == 1


@pytest.mark.dist
def test_moe_runs_export_as_olmoe_and_flexolmo_with_olmx_logits_and_greedy_continuation(tmp_path, hf_offline) -> None:
    """A pre-norm MoE run as OLMoE, a post-norm one as FlexOlmo (experts fused as transformers
    keeps them, the router as its gate): the logits are olmx's (float32, within LOGIT_TOL) and
    so is the greedy continuation (``olmx generate``)."""
    import torch
    from transformers import AutoModelForCausalLM

    from olmx.generate import Sampling, decode, generate
    from olmx.local_model import choose_checkpoint, load_model, one_process
    from olmx.plan.resolve import local_plan
    from olmx.registry import registry

    prompt = "def main(argv):\n    "
    ids = torch.tensor([list(prompt.encode())])
    for cls, settings in MOE_ARCHS.items():
        run, out = tmp_path / cls, tmp_path / f"{cls}-hf"
        one = ["infra.nproc_per_node=1", "parallel=[]", "trainer.max_steps=2", "model.n_kv_heads=2"]
        _train(run, tmp_path / "cache", *MOE, *settings, *one)
        proc = olmx_cli("export", "hf", str(run), "--out", str(out))
        assert proc.returncode == 0 and f"{cls}, checkpoint step 2" in proc.stdout, proc.stdout + proc.stderr
        config = json.loads((out / "config.json").read_text())
        assert config["architectures"] == [cls] and (config["num_experts"], config["num_experts_per_tok"]) == (4, 2)
        hf = AutoModelForCausalLM.from_pretrained(out).eval()
        assert type(hf).__name__ == cls
        reg = registry()
        plan = local_plan(run, reg)
        with one_process(plan):
            model = load_model(plan, reg, choose_checkpoint(run, None)).eval()
            with torch.no_grad():
                diff = (model(ids) - hf(ids).logits).abs().max().item()
            state = model.state_dict()
        assert diff <= LOGIT_TOL, (cls, diff)
        # The same weights in the olmo_core backend's layout (OLMo-core v1 MoE keys) export to the
        # same tensors (that backend trains only with CUDA or Triton's interpreter).
        from olmx_plugins.layers.moe.convert import convert_model_state_dict
        from olmx_plugins.layers.moe.hf import hf_checkpoint

        cfg = plan.run.layers["moe"]
        v1 = convert_model_state_dict(
            state, to="olmo_core_v1", num_experts=4, d_model=plan.run.model.d_model, hidden_size=256, dropless=True
        )
        assert any("feed_forward_moe" in k for k in v1)
        as_v1 = dataclasses.make_dataclass("Built", ["sd", "vocab_size"])(v1, model.vocab_size)
        as_v1.state_dict = lambda v1=v1: v1
        (_, a), (_, b) = hf_checkpoint(cfg, model, plan, "portable"), hf_checkpoint(cfg, as_v1, plan, "olmo_core")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        ours, _ = generate(run, prompt, Sampling(max_new_tokens=16, temperature=0))
        with torch.no_grad():
            theirs = hf.generate(ids, max_new_tokens=16, do_sample=False)[0, ids.shape[1] :].tolist()
        assert ours == decode(plan, [t for t in theirs if t != 256]), cls
        # the export's byte-level tokenizer (transformers made an empty one for OLMoE, and its
        # generation failed on no input ids): the same ids, the same continuation
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(out)
        encoded = tok(prompt, return_tensors="pt")
        assert encoded["input_ids"].tolist() == ids.tolist(), cls
        with torch.no_grad():
            again = hf.generate(**encoded, max_new_tokens=16, do_sample=False)[0, ids.shape[1] :]
        assert tok.decode(again, skip_special_tokens=True) == ours, cls


def test_a_byte_level_export_has_a_tokenizer_transformers_reads_as_olmx_encodes(tmp_path, hf_offline) -> None:
    """Without tokenizer files transformers makes an empty tokenizer for a Llama or OLMoE
    directory (generation then fails on no input); the byte-level one written encodes to the
    UTF-8 bytes, names the run's special ids, and generation continues as olmx's greedy loop."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from olmx.export import _save_byte_tokenizer
    from olmx.worker.hf import save_hf

    plan = plan_for(tmp_path)
    model = built(plan, 0)
    out = tmp_path / "hf"
    save_hf(model, plan, "llama", out)
    assert "byte-level" in _save_byte_tokenizer(plan, out)
    tok = AutoTokenizer.from_pretrained(out)
    prompt = "def main(argv):\n    héllo ✓"
    ids = tok(prompt, return_tensors="pt")["input_ids"]
    assert ids[0].tolist() == list(prompt.encode())
    assert (tok.eos_token_id, tok.pad_token_id) == (plan.run.data.tokenizer.eos_id, plan.run.data.tokenizer.pad_id)
    assert tok.decode(list(prompt.encode())) == prompt
    hf = AutoModelForCausalLM.from_pretrained(out).eval()
    got = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False)[0, ids.shape[1] :]
    mine = ids
    with torch.no_grad():
        for _ in range(6):
            logits = model(mine)[0, -1, : plan.run.data.tokenizer.vocab_size]
            mine = torch.cat([mine, logits.argmax().view(1, 1)], dim=1)
    assert got.tolist() == mine[0, ids.shape[1] :].tolist()

"""Mixture of experts: turns the FFNs of chosen blocks into routed (and shared) experts.

Two execution paths, one config (``layers.moe.backend``):

* ``portable``: olmx's own MoE (:mod:`.block`), runs on CPU and GPU, the tested reference;
* ``olmo_core``: the same layer mapped onto OLMo-core's v1 MoE (``MoEBlockConfig.to_olmo_core_v1``:
  ``MoEConfig`` in ``moe`` / ``moe_reordered_norm`` blocks of a ``MoETransformer``) for its
  Triton token permutation and grouped GEMMs. CUDA only. Expert parallelism then is OLMo-core's
  own (``ep_config``, where the mesh shards parameters and has ``ep > 1``). OLMo-core's DDP + EP
  lives in its v2 stack (``OLMoDDPModelConfig``), which olmx does not map: expert parallelism
  over replicated (DDP) parameters uses the portable path;
* ``auto``: ``portable`` for now. OLMo-core's path is opt-in until olmx has run its parity
  test (marked ``gpu``) on a GPU; the plan says why, and whether olmo_core could run.

This plugin owns expert parallelism: a data-parallel strategy only asks for it (``mesh.ep``,
e.g. ``ddp_ep`` or ``hsdp`` with ``parallel.hsdp.expert_parallel=true``), and :meth:`MoELayer.apply_model`
places the experts over ``ep`` ranks. Checkpoints of the two paths differ only in the MoE
keys (``blocks.<i>.feed_forward_moe.*`` vs ``blocks.<i>.moe.*``); ``convert.convert_model_state_dict``
maps them both ways. Both backends start from the same weights for one seed: the olmo_core
backend initialises its MoE layers as the portable one does (:mod:`.seeded_init`).

One config: :class:`~.config.MoEConfig` (``layers.moe``), validated here in :meth:`MoELayer.resolve`
and nowhere else; the OLMo-core-side ``MoEFeedForwardConfig`` / ``MoEBlockConfig`` are derived
from it at build (:meth:`MoELayer.moe_config`).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import replace
from typing import Any, Optional

from olmx.api import FF_H, Context, Contribution, LayerPlugin, LinearLayer, Mesh, World
from olmx.errors import ConfigError
from olmx_plugins.layers.moe.config import MoEConfig, MoEDecisions, expert_hidden, moe_blocks


def triton_interpreted() -> bool:
    """``TRITON_INTERPRET=1``: Triton kernels run on CPU through Triton's interpreter (slow; for
    numerics), so OLMo-core's MoE can run on a CPU run too."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def olmo_core_problem(cfg: MoEConfig, mesh: Mesh, world: World) -> Optional[str]:
    """Why OLMo-core's v1 MoE cannot run this layer on this mesh and world (None: it can)."""
    if world.device != "cuda" and triton_interpreted() and importlib.util.find_spec("triton") is None:
        return "TRITON_INTERPRET=1 is set but triton is not installed (pip install triton)"
    if world.device != "cuda" and not triton_interpreted():
        return (
            f"OLMo-core's MoE needs CUDA (its token permutation is Triton kernels) and this run's device is "
            f"{world.device_name} ({world.device}); TRITON_INTERPRET=1 runs them on CPU through Triton's "
            "interpreter (slow; for numerics)"
        )
    if mesh.ep > 1 and not mesh.shards_params:
        return (
            "OLMo-core's expert parallelism over replicated (DDP) parameters is its v2 stack "
            "(OLMoDDPModelConfig), which olmx does not map: use a data-parallel strategy that shards "
            "parameters (parallel=[hsdp] parallel.hsdp.expert_parallel=true), or the portable backend"
        )
    if cfg.shared_hidden_size is not None:
        return (
            "OLMo-core's v1 MoE mixes a shared expert as shared/(k+1) + routed*k/(k+1), not as olmx's shared + routed"
        )
    return None


def python_expert_loop(cfg: MoEConfig, world: World) -> Optional[str]:
    """Why OLMo-core's MoE will be slow on this CUDA world (None: it will not): without the
    ``grouped_gemm`` package its dropless experts (``DroplessMoEMLP.gmm``) run as a Python loop
    over the experts. (Its capacity MoE uses batched matmuls; on CPU the interpreter is slow
    anyway.)"""
    if world.device != "cuda" or cfg.capacity_factor is not None or importlib.util.find_spec("grouped_gemm"):
        return None
    return (
        "the grouped_gemm package is not installed, so OLMo-core's dropless MoE runs its experts as a "
        f"Python loop: 3 x {cfg.num_experts} small matmuls per MoE block and micro-batch (and their "
        "backward) behind 3 device-to-host copies of the group sizes; fix: "
        "pip install grouped_gemm (a CUDA build against your torch), or layers.moe.backend=portable "
        "(torch's grouped_mm)"
    )


def interpret_olmo_core_kernels() -> None:
    """Under Triton's interpreter (a CPU run with ``TRITON_INTERPRET=1``): keep one config of
    each autotuned OLMo-core MoE kernel, since the autotuner benchmarks its configs on a GPU."""
    from olmo_core.kernels import moe as kernels
    from triton.runtime.autotuner import Autotuner

    for kernel in vars(kernels).values():
        if isinstance(kernel, Autotuner):
            kernel.configs = kernel.configs[:1]


def choose_backend(cfg: MoEConfig, mesh: Mesh, world: World) -> tuple[str, str]:
    """``(backend, why)`` for ``layers.moe.backend`` on this mesh and world; ``olmo_core``
    where it cannot run is a ConfigError."""
    problem = olmo_core_problem(cfg, mesh, world)
    if cfg.backend == "olmo_core":
        if problem:
            raise ConfigError(
                "layers.moe.backend", f"olmo_core cannot run here: {problem}; use layers.moe.backend=portable or auto"
            )
        return "olmo_core", "chosen"
    if cfg.backend == "portable":
        return "portable", "chosen"
    if problem:
        return "portable", f"auto: {problem}"
    return "portable", (
        "auto: OLMo-core's MoE could run here but is opt-in (layers.moe.backend=olmo_core) until "
        "olmx has checked it on a GPU"
    )


def moe_activations_per_token(cfg: MoEConfig, model: Any, ctx: Context) -> int:
    """Bytes per token one MoE block keeps for backward beyond a dense block's feed-forward
    (``FF_H`` h-wide tensors, :mod:`olmx.plan.memory`), under the run's activation
    checkpointing. Each of the ``k`` routed copies of a token keeps the expert SwiGLU's
    ``FF_H`` hidden tensors, its input and its output; the block keeps the combined output and
    the router its float32 input, logits, scores, weights and indices (counted with autograd's
    saved-tensor hooks); a shared expert is one more SwiGLU. ``full`` checkpointing recomputes
    the block; ``long_context`` recomputes modules named ``feed_forward`` only, so the whole
    MoE is kept."""
    mode = ctx.run.trainer.activation_checkpointing
    if mode == "full":
        return 0
    d, h, k, b = model.d_model, expert_hidden(cfg, model), cfg.top_k, ctx.dtypes.compute_bytes
    shared = FF_H * cfg.shared_hidden_size + d if cfg.shared_hidden_size else 0
    kept = (k * (FF_H * h + 2 * d) + d + shared) * b + (d + 2 * cfg.num_experts + 3 * k) * 4
    return kept if mode == "long_context" else kept - FF_H * model.hidden_size * b


def expert_mixed_precision(plan: Any) -> Any:
    """The experts' FSDP mixed-precision policy under expert parallelism: the plan's dtypes,
    as the dense part gets them, where parameters are sharded (FSDP2 all-gathers the experts in
    ``param``, reduces in ``reduce``); None elsewhere (replicated parameters: autocast, which
    the experts' forward follows)."""
    if not plan.mesh.shards_params or plan.dtypes == type(plan.dtypes)():
        return None
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(
        param_dtype=getattr(torch, plan.dtypes.param), reduce_dtype=getattr(torch, plan.dtypes.reduce)
    )


class MoELayer(LayerPlugin):
    """Places MoE blocks (portable, or OLMo-core v1 on the olmo_core backend) with OLMo-core's
    named blocks / block overrides; owns expert parallelism."""

    name = "moe"
    api = ">=3.0,<4"
    Config = MoEConfig
    Decisions = MoEDecisions
    #: Replaces the feed-forward of whole blocks: before plugins that extend blocks.
    order = 10
    experts = True
    #: MoE blocks are token-wise: on any pipeline stage they need only the hidden states (either
    #: backend: both train to one process's losses there).
    pipeline_parallel = True

    def backend(self, plan: Any) -> str:
        """The backend the plan chose (``portable`` or ``olmo_core``)."""
        return str(self.decided(plan).backend)

    def resolve(self, cfg: MoEConfig, ctx: Context) -> Contribution:
        """Check the settings and the expert-parallel degree; count total and active parameters
        of the MoE blocks; choose the backend."""
        m, mesh = ctx.run.model, ctx.mesh
        if cfg.top_k > cfg.num_experts:
            raise ConfigError(
                "layers.moe.top_k", f"{cfg.top_k} must be between 1 and layers.moe.num_experts={cfg.num_experts}"
            )
        blocks = moe_blocks(cfg, m.n_layers)
        bad = [b for b in blocks if not 0 <= b < m.n_layers]
        if bad:
            raise ConfigError("layers.moe.blocks", f"{bad} outside [0, model.n_layers={m.n_layers})")
        if not blocks:
            raise ConfigError("layers.moe.every", f"{cfg.every} selects no block of model.n_layers={m.n_layers}")
        if cfg.num_experts % mesh.ep:
            raise ConfigError(mesh.ep_field, f"{mesh.ep} must divide layers.moe.num_experts={cfg.num_experts}")
        d, h = m.d_model, expert_hidden(cfg, m)
        per_block = cfg.num_experts * d + 3 * cfg.num_experts * d * h + 3 * d * (cfg.shared_hidden_size or 0)
        active = per_block - 3 * (cfg.num_experts - cfg.top_k) * d * h
        dense = 3 * d * m.hidden_size
        dispatch = "dropless" if cfg.capacity_factor is None else f"capacity factor {cfg.capacity_factor}"
        expert_params = len(blocks) * 3 * cfg.num_experts * d * h
        backend, why = choose_backend(cfg, mesh, ctx.world)
        # the portable backend places the experts itself under expert parallelism, whatever the
        # data-parallel strategy: FSDP over the R = dp / ep replicas of each expert group, out of
        # the strategy's reach (OLMo-core's backend leaves them to its FSDP)
        placed, replicas = mesh.ep > 1 and backend == "portable", mesh.dp // mesh.ep
        rows = [
            ("backend", f"{backend} ({why})"),
            ("MoE blocks", f"{blocks} of {m.n_layers}"),
            ("experts", f"{cfg.num_experts} x SwiGLU({d}->{h}), top-{cfg.top_k} {cfg.gating}, {dispatch}"),
            ("parameters per MoE block", f"{per_block:,} total, {active:,} active"),
        ]
        if cfg.shared_hidden_size:
            rows.append(("shared expert", f"SwiGLU({d}->{cfg.shared_hidden_size})"))
        if backend == "olmo_core" and (slow := python_expert_loop(cfg, ctx.world)):
            rows.append(("warning", slow))
        if mesh.ep > 1:
            rows.append(
                (
                    "expert parallel",
                    f"{cfg.num_experts // mesh.ep} experts per rank over {mesh.ep} ranks, "
                    f"{mesh.dp // mesh.ep} replica group(s)" + (" per pipeline stage" if mesh.pp > 1 else ""),
                )
            )
        return Contribution(
            rows=rows,
            params=len(blocks) * (per_block - dense),
            activation_bytes_per_token=len(blocks) * moe_activations_per_token(cfg, m, ctx),
            active_params=len(blocks) * (active - dense),
            # placed experts: each rank computes with n = E / ep experts and stores its chunk of
            # them (FSDP2 over the R replicas: one expert on each of the first n ranks where
            # R >= n, n / R where R divides n), with their gradients and optimizer state; it
            # gathers a layer's, prefetching the next one's
            sharded_params=expert_params if placed else 0,
            sharded_over=mesh.ep * min(replicas, cfg.num_experts // mesh.ep),
            gathered_params=min(2, len(blocks)) * expert_params // (len(blocks) * mesh.ep)
            if placed and replicas > 1
            else 0,
            decisions=MoEDecisions(backend=backend),
        )

    def hf_architecture(self, cfg: MoEConfig, run: Any) -> str:
        """OLMoE (pre-norm) or FlexOlmo (post-norm) where the layer and the model are one of them
        (:func:`.hf.hf_class` says what must hold)."""
        from olmx_plugins.layers.moe.hf import hf_class

        return hf_class(cfg, run)

    def hf_checkpoint(self, cfg: MoEConfig, model: Any, plan: Any) -> tuple[Any, dict[str, Any]]:
        """The OLMoE / FlexOlmo config and state of the built model (:func:`.hf.hf_checkpoint`)."""
        from olmx_plugins.layers.moe.hf import hf_checkpoint

        return hf_checkpoint(cfg, model, plan, self.backend(plan))

    def linear_layers(self, cfg: MoEConfig, ctx: Context, layers: list[LinearLayer]) -> list[LinearLayer]:
        """The model's ``nn.Linear`` layers (:mod:`olmx.plan.linears`) with MoE blocks: their
        dense feed-forward is gone; routers and routed experts are plain weights (not
        ``nn.Linear``); a shared expert brings three ``nn.Linear`` subclasses (seeded init)."""
        blocks = moe_blocks(cfg, ctx.run.model.n_layers)
        gone = tuple(f"blocks.{i}.feed_forward." for i in blocks)
        out = [layer for layer in layers if not layer.name.startswith(gone)]
        d, s = ctx.run.model.d_model, cfg.shared_hidden_size
        if s:
            out += [
                LinearLayer(f"blocks.{i}.moe.shared_expert.{w}", a, b, subclass=True)
                for i in blocks
                for w, a, b in (("w1", d, s), ("w2", s, d), ("w3", d, s))
            ]
        return out

    def moe_config(self, cfg: MoEConfig, plan: Any) -> Any:
        """The portable MoE's OLMo-core-side config, derived from ``cfg`` (validated by
        :meth:`resolve`) and the plan: the expert width resolved against the model, the
        initialisation from ``model.init_std`` and ``trainer.seed``."""
        from olmx_plugins.layers.moe.block import MoEFeedForwardConfig

        model = plan.run.model
        return MoEFeedForwardConfig(
            num_experts=cfg.num_experts,
            top_k=cfg.top_k,
            hidden_size=expert_hidden(cfg, model),
            gating=cfg.gating,
            normalize_expert_weights=cfg.normalize_expert_weights,
            bias_gamma=cfg.bias_gamma,
            shared_hidden_size=cfg.shared_hidden_size,
            capacity_factor=cfg.capacity_factor,
            lb_loss_weight=cfg.lb_loss_weight,
            z_loss_weight=cfg.z_loss_weight,
            init_std=model.init_std,
            init_seed=plan.run.trainer.seed,
        )

    def apply_model_config(self, cfg: MoEConfig, model_config: Any, plan: Any) -> Any:
        """Named blocks + pattern for ``every`` (dotted overrides reach them), block overrides
        for an explicit list. The blocks are portable ``MoEBlockConfig``s, or with the
        ``olmo_core`` backend their OLMo-core v1 equivalent in an ``MoETransformer``."""
        from olmo_core.nn.transformer import TransformerType

        from olmx_plugins.layers.moe.block import MoEBlockConfig

        if isinstance(model_config.block, dict):
            raise ConfigError(
                "layers.moe",
                "another layer plugin already replaced the blocks; combining it with moe is not supported yet",
            )
        dense = model_config.block
        moe: Any = MoEBlockConfig.from_dense(dense, moe=self.moe_config(cfg, plan))
        if self.backend(plan) == "olmo_core":
            if plan.world.device != "cuda":
                interpret_olmo_core_kernels()
            moe = moe.to_olmo_core_v1()
            model_config = replace(model_config, name=TransformerType.moe)
        if cfg.blocks is not None:
            overrides = dict(model_config.block_overrides or {})
            overrides.update({i: moe for i in moe_blocks(cfg, model_config.n_layers)})
            return replace(model_config, block_overrides=overrides)
        return replace(
            model_config, block={"dense": dense, "moe": moe}, block_pattern=["dense"] * (cfg.every - 1) + ["moe"]
        )

    def apply_model(self, cfg: MoEConfig, model: Any, plan: Any) -> None:
        """On the olmo_core backend: the model will initialise its MoE layers as the portable
        backend does (same seed, same weights, :mod:`.seeded_init`), when OLMo-core's train
        module calls ``init_weights`` after applying parallelism. With ``mesh.ep > 1`` on the
        portable backend: shard the experts over each group of ``ep`` consecutive ranks, with
        FSDP over the replica groups (which keeps them out of the data-parallel wrapper and
        averages their gradients across replicas); under pipeline parallelism the groups are
        those of the stage's ranks (this edits each stage)."""
        if self.backend(plan) == "olmo_core":
            from olmx_plugins.layers.moe.seeded_init import PortableMoEInit

            model.init_method = PortableMoEInit(model.init_method, self.moe_config(cfg, plan))
            return
        if plan.mesh.ep == 1:
            return
        from torch.distributed.device_mesh import init_device_mesh

        from olmx_plugins.layers.moe.expert_parallel import apply_expert_parallel

        device = "cuda" if plan.world.device == "cuda" else "cpu"
        mesh = init_device_mesh(
            device, (plan.mesh.pp, *plan.mesh.expert_mesh_shape()), mesh_dim_names=("pp", "ep_replicate", "ep_shard")
        )
        apply_expert_parallel(
            model, ep_mesh=mesh["ep_shard"], replicate_mesh=mesh["ep_replicate"], mp_policy=expert_mixed_precision(plan)
        )

    def apply_train_module(self, cfg: MoEConfig, train_module: Any, plan: Any, param_names: tuple[str, ...]) -> Any:
        """On the olmo_core backend with ``mesh.ep > 1``: OLMo-core's own expert parallelism
        (``ep_config``), as its v1 stack requires."""
        if plan.mesh.ep > 1 and self.backend(plan) == "olmo_core":
            from olmo_core.train.train_module import TransformerExpertParallelConfig

            train_module.ep_config = TransformerExpertParallelConfig(degree=plan.mesh.ep)
        return train_module

    def callbacks(self, cfg: MoEConfig, plan: Any) -> dict[str, Any]:
        """Expert-bias balancing after every step (when ``bias_gamma`` is set; OLMo-core's
        ``MoETransformer`` does it itself on the olmo_core backend)."""
        if cfg.bias_gamma is None or self.backend(plan) == "olmo_core":
            return {}
        from olmx_plugins.layers.moe.callbacks import ExpertBiasCallback

        return {"moe_expert_bias": ExpertBiasCallback()}


MOE = MoELayer()

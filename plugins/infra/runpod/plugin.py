"""RunPod: GPU pods (an instant cluster for several nodes) made through RunPod's REST API, trained on over SSH.

``olmx train infra=runpod ...`` creates the pod (or uses ``infra.pod_id``), waits until it
runs with SSH, copies the plan, a bootstrap script (``templates/runpod/bootstrap.sh.j2``) and
the olmx source to ``infra.workdir`` on the pod's container disk, starts the bootstrap (which
installs olmx with pinned dependencies and runs torchrun), follows the run with the usual
progress bar, copies the run directory (checkpoints included) back into the local one, and
stops the pod unless ``infra.keep=true``. The container disk is wiped when a pod stops: the
copy back comes first, and when it fails the pod is left running.

The API key comes from ``RUNPOD_API_KEY`` (or ``~/.runpod/olmx_api_key``); it is only ever
sent in the Authorization header and never printed, logged or written. Values of
``infra.pass_env`` variables go to the pod's environment and nowhere else.

This module holds the plugin and its hooks (the plugin contract: settings checks, the world,
the dry run); its settings are :mod:`.config`, what it asks RunPod to create :mod:`.creation`,
the launch's steps :mod:`.orchestrate`, what it ships to the pods :mod:`.payload`, its SSH
steps :mod:`.remote`, and its RunPod client :mod:`.provision` (over :mod:`.rest` and
:mod:`.transport`).
"""

from __future__ import annotations

import re
from typing import Any

from olmx.api import InfraPlugin, World
from olmx.errors import ConfigError
from olmx_plugins.infra.runpod.config import RunPodConfig
from olmx_plugins.infra.runpod.creation import candidates, pod_env, pod_name, request_body, stored_env_note
from olmx_plugins.infra.runpod.orchestrate import KNOWN_HOSTS_DIR
from olmx_plugins.infra.runpod.payload import render_bootstrap, shipped_data_note

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: What olmx accepts as a RunPod secret's name (``{{ RUNPOD_SECRET_<name> }}``).
_SECRET_NAME = re.compile(r"[A-Za-z0-9_-]+")


class RunPodInfra(InfraPlugin):
    """RunPod: GPU pods (an instant cluster for several nodes) made through RunPod's REST API, trained on over SSH."""

    name = "runpod"
    api = ">=3.0,<4"
    Config = RunPodConfig

    def commands(self) -> Any:
        """``olmx provision runpod ...``."""
        from olmx_plugins.infra.runpod.commands import app

        return app(self)

    # -- plan --------------------------------------------------------------------------------

    def data_on_this_machine(self, cfg: RunPodConfig) -> bool:
        """Shipped data is read here first; with ``infra.ship_data=false`` it is on the pods."""
        return cfg.ship_data

    def world(self, cfg: RunPodConfig) -> World:
        """Processes from the settings; every setting that reaches RunPod is checked here."""
        from olmx.launch.devices import gpu_compute_capability, gpu_memory_gib
        from olmx_plugins.infra.runpod.spec import CloudType

        gpus = cfg.gpus()
        if cfg.nodes > 1 and not gpus:
            raise ConfigError("infra.nodes", "several nodes make an instant cluster, which has GPU pods only")
        if cfg.pod_id and cfg.nodes > 1:
            raise ConfigError("infra.pod_id", f"one pod cannot hold infra.nodes={cfg.nodes}; use infra.cluster_id")
        if cfg.cluster_id and cfg.nodes < 2:
            raise ConfigError("infra.cluster_id", "a cluster has at least 2 nodes: set infra.nodes")
        if cfg.cloud not in CloudType.__members__:
            raise ConfigError("infra.cloud", f"'{cfg.cloud}' is not one of {', '.join(CloudType.__members__)}")
        self._check_gpu_types(cfg, gpus, gpu_compute_capability)
        self._check_env(cfg)
        nproc = cfg.nproc_per_node if cfg.nproc_per_node is not None else (gpus or 2)
        if gpus and nproc > gpus:
            raise ConfigError("infra.nproc_per_node", f"{nproc} processes per pod with infra.gpus_per_node={gpus}")
        # Every body RunPod could get is valid (pass_env's values are only known at launch).
        candidates(cfg, name="olmx-check", env={**pod_env(cfg, values=False)})
        if not gpus:
            return World(nnodes=1, nproc_per_node=nproc)
        return World(
            nnodes=cfg.nodes,
            nproc_per_node=nproc,
            device="cuda",
            device_name=cfg.gpu_type,
            compute_capability=gpu_compute_capability(cfg.gpu_type),
            device_memory_gib=gpu_memory_gib(cfg.gpu_type),
        )

    @staticmethod
    def _check_gpu_types(cfg: RunPodConfig, gpus: int, capability: Any) -> None:
        """The fallback GPU types: only on GPU pods, and each as capable as ``gpu_type`` (the
        precision plugins checked the plan against its compute capability, the memory estimate
        against its memory)."""
        if cfg.gpu_types and not gpus:
            raise ConfigError("infra.gpu_types", "a CPU pod (infra.gpus_per_node=0) has no GPU type to fall back from")
        from olmx.launch.devices import gpu_memory_gib

        want, room = capability(cfg.gpu_type), gpu_memory_gib(cfg.gpu_type)
        for other in cfg.gpu_types:
            less = gpu_memory_gib(other)
            if room and (less is None or less < room):
                raise ConfigError(
                    "infra.gpu_types",
                    f"{other!r} has {f'{less:g} GiB' if less else 'an unknown amount of'} memory, less than "
                    f"infra.gpu_type={cfg.gpu_type!r} ({room:g} GiB), which the plan's memory estimate is checked "
                    "against; fall back only to GPUs with as much memory",
                )
            if capability(other) != want:
                got = capability(other)
                raise ConfigError(
                    "infra.gpu_types",
                    f"{other!r} has compute capability {_sm(got)}, but the plan is made for infra.gpu_type="
                    f"{cfg.gpu_type!r} ({_sm(want)}); fall back only to GPUs with the same capability",
                )

    @staticmethod
    def _check_env(cfg: RunPodConfig) -> None:
        """``env``, ``secrets`` and ``pass_env``: names, no secret in the plan, no name twice."""
        from olmx_plugins.infra.runpod.transport import looks_secret

        for name in cfg.env:
            if looks_secret(name):
                raise ConfigError(
                    "infra.env",
                    f"{name} looks like a secret, and infra.env is saved in the plan: store it as a RunPod "
                    f"secret and set infra.secrets.{name}=<secret name>, or list it in infra.pass_env "
                    "(its value is taken from this environment)",
                )
        for name, secret in cfg.secrets.items():
            if not _ENV_NAME.fullmatch(name):
                raise ConfigError("infra.secrets", f"{name!r} is not an environment variable name")
            if not _SECRET_NAME.fullmatch(str(secret)):
                raise ConfigError(
                    "infra.secrets", f"{name}: {secret!r} is not a RunPod secret name (letters, digits, _ and -)"
                )
        for name in cfg.pass_env:
            if not _ENV_NAME.fullmatch(name):
                raise ConfigError("infra.pass_env", f"{name!r} is not an environment variable name")
            if name == "RUNPOD_API_KEY":
                raise ConfigError("infra.pass_env", "the RunPod API key never goes to a pod")
        sources = [
            ("infra.env", set(cfg.env)),
            ("infra.secrets", set(cfg.secrets)),
            ("infra.pass_env", set(cfg.pass_env)),
        ]
        for i, (key, names) in enumerate(sources):
            for other, other_names in sources[i + 1 :]:
                if names & other_names:
                    raise ConfigError(other, f"{', '.join(sorted(names & other_names))} is also set in {key}")

    def preflight(self, cfg: RunPodConfig, plan: Any) -> None:
        """Before the run directory is written: the API key is there (``RUNPOD_API_KEY`` or the
        key file; read, never shown), and when olmx is to create the pods, the account has a
        registered SSH key that this machine holds (:func:`.keys.check_ssh_keys`): without one
        RunPod's ``startSsh`` does nothing and the pods could not be reached. (``--dry-run``
        needs neither.)"""
        from olmx_plugins.infra.runpod.errors import RunPodAuthError
        from olmx_plugins.infra.runpod.keys import check_ssh_keys
        from olmx_plugins.infra.runpod.provision import RunPodClient
        from olmx_plugins.infra.runpod.transport import _load_key

        try:
            _load_key(None)
        except RunPodAuthError as exc:
            raise ConfigError("infra=runpod", str(exc)) from None
        if not (cfg.pod_id or cfg.cluster_id):
            check_ssh_keys(RunPodClient.from_env(), cfg.ssh_key)

    # -- dry run -----------------------------------------------------------------------------

    def dry_run(self, cfg: RunPodConfig, plan: Any) -> str:
        """The requests (key and passed secrets redacted), the bootstrap script and the SSH
        steps, in order. Sends nothing and needs no API key."""
        from olmx_plugins.infra.runpod.transport import redacted_request

        w = cfg.workdir
        stop = (
            "DELETE /v2/clusters/{id}  (an instant cluster cannot be stopped)"
            if cfg.nodes > 1
            else redacted_request("POST", "/v2/pods/{id}/action", {"action": "stop"})
        )
        parts = [
            "# 1. Check that the RunPod account has a registered SSH key that this machine holds "
            "(GET /v2/account/ssh-keys), create the pods and wait until every one runs with SSH "
            f"(GET every {cfg.poll_seconds:g} s, at most {cfg.wait_timeout:g} s) and its sshd answers "
            f"(at most {cfg.ssh_wait_timeout:g} s more)"
            if not (cfg.pod_id or cfg.cluster_id)
            else f"# 1. Use the existing "
            f"{'cluster ' + str(cfg.cluster_id) if cfg.cluster_id else 'pod ' + str(cfg.pod_id)}"
            " (started if stopped) and wait until it runs with SSH",
        ]
        if not (cfg.pod_id or cfg.cluster_id):
            tries = candidates(cfg, name=pod_name(cfg, plan), env=pod_env(cfg, values=False))
            if len(tries) > 1:
                parts.append(
                    "#    Asked in this order until RunPod has capacity (an answer 400 moves on to the "
                    "next): " + "; ".join(f"{i}. {label}" for i, (label, _) in enumerate(tries, 1))
                )
            if note := stored_env_note(cfg):
                parts.append(f"#    Note: {note}")
            path, body = request_body(tries[0][1])
            parts.append(redacted_request("POST", path, body))
        parts += [
            f"\n# 2. Copy to {w} on every node (ssh ... 'tar -xzf - -C {w}'): run/plan.yaml (run_dir "
            f"{w}/run), bootstrap.sh, constraints.txt (the dependency pins of this olmx)"
            + (", olmx-src/" if cfg.install else "")
            + shipped_data_note(plan, cfg)
            + (f", run/checkpoints/step{plan.resume_step} (resuming)" if plan.resume_step is not None else ""),
            "#    then start it: ssh ... 'cd {w} && NODE_RANK=<rank> NUM_NODES={n} nohup setsid bash bootstrap.sh &'. "
            "bootstrap.sh:".format(w=w, n=cfg.nodes),
            self.bootstrap(cfg, plan).rstrip("\n"),
            f"\n# 3. Follow: every {cfg.poll_seconds:g} s, copy new lines of {w}/run/metrics.jsonl and the node-0 log "
            "into the local run directory (progress bar)",
            f"# 4. Copy {w}/run (checkpoints, metrics, summary, logs) back into {plan.run_dir}",
            "# 5. " + ("Leave the pods running (infra.keep=true)" if cfg.keep else f"Stop the pods:\n{stop}"),
            f"# Host keys: accepted on first use into {plan.run_dir}/{KNOWN_HOSTS_DIR}/known_hosts-<launch id>, "
            "a new file for every launch (RunPod reuses IP:port pairs across pods)",
        ]
        return "\n".join(parts)

    def bootstrap(self, cfg: RunPodConfig, plan: Any, launch_id: str = "runpod-LAUNCH") -> str:
        """The bootstrap script every node of one launch runs (``templates/runpod/bootstrap.sh.j2``);
        ``launch_id`` names the launch in ``events.jsonl`` (each launch gets a fresh one)."""
        return render_bootstrap(cfg, plan, launch_id)

    def launch(self, cfg: RunPodConfig, plan: Any) -> int:
        """Provision (or reuse), ship, start, follow, copy back, stop (:func:`.orchestrate.launch`)."""
        from olmx_plugins.infra.runpod import orchestrate

        return orchestrate.launch(cfg, plan)

    def job_status(self, cfg: RunPodConfig, plan: Any) -> str:
        """The pods' RunPod status, and the training's state and last step on node 0."""
        from olmx_plugins.infra.runpod import orchestrate

        return orchestrate.job_status(cfg, plan)

    def job_logs(self, cfg: RunPodConfig, plan: Any, lines: int) -> str:
        """The end of node 0's log, read on the pod."""
        from olmx_plugins.infra.runpod import orchestrate

        return orchestrate.job_logs(cfg, plan, lines)

    def job_cancel(self, cfg: RunPodConfig, plan: Any) -> None:
        """Stop the training, copy the run back, stop the pods (unless ``infra.keep``)."""
        from olmx_plugins.infra.runpod import orchestrate

        orchestrate.job_cancel(cfg, plan)


def _sm(capability: tuple[int, int] | None) -> str:
    return f"SM{capability[0]}{capability[1]}" if capability else "unknown"


RUNPOD = RunPodInfra()

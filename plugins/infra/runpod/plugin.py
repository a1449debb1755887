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
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

from olmx.api import InfraPlugin, World
from olmx.errors import ConfigError, LaunchError, RunFailed
from olmx.launch import TorchrunConfig
from olmx.rundir import RunDir

#: RunPod's PyTorch image with olmx's torch pin (2.13.0). Why this tag: it is the CUDA 13.0
#: build of RunPod's 1.2.0 image line (runpod/containers, official-templates/pytorch), and
#: CUDA 13 + torch 2.13 is the combination FlashAttention publishes a prebuilt wheel for
#: (see DEFAULT_FLASH_ATTN_WHEEL), so nothing is compiled in the pod; Ubuntu 24.04 gives
#: Python 3.12, the wheel's ABI. CUDA 13 builds also run on Blackwell GPUs. Such a pod needs a
#: host whose driver supports CUDA 13, hence the default ``min_cuda_version``.
DEFAULT_IMAGE = "runpod/pytorch:1.2.0-cu1300-torch2130-ubuntu2404"
#: FlashAttention's prebuilt wheel for CUDA 13 / torch 2.13 (its setup.py names release
#: assets this way); ``{python_tag}`` is filled on the pod (``cp312``).
DEFAULT_FLASH_ATTN_WHEEL = (
    "https://github.com/Dao-AILab/flash-attention/releases/download/v2.8.3.post1/"
    "flash_attn-2.8.3.post1+cu13torch2.13cxx11abiTRUE-{python_tag}-{python_tag}-linux_x86_64.whl"
)
#: Local known-hosts file of the run (pods' host keys).
KNOWN_HOSTS = ".ssh_known_hosts"
#: Template of the bootstrap script inside the templates folder.
TEMPLATE = "runpod/bootstrap.sh.j2"
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: Spec field -> config key, for errors raised while building a request body.
_SPEC_KEYS = {
    "gpu_count": "gpus_per_node",
    "gpus_per_pod": "gpus_per_node",
    "pod_count": "nodes",
    "gpu_type_id": "gpu_type",
    "cpu_flavor_id": "cpu_flavor",
    "vcpu_count": "vcpus",
}


@dataclass
class RunPodConfig(TorchrunConfig):
    """Settings of ``infra=runpod``."""

    #: RunPod GPU type id (``NVIDIA H100 80GB HBM3``, ``NVIDIA B200``, ...).
    gpu_type: str = "NVIDIA H100 80GB HBM3"
    #: GPUs per pod; 0 makes a CPU pod (``cpu_flavor``, ``vcpus``): a cheap check that a run starts.
    gpus_per_node: int = 1
    #: Worker processes per pod; null means one per GPU, or 2 on a CPU pod.
    nproc_per_node: Optional[int] = None
    #: Pods; more than one makes a RunPod instant cluster (GPU pods on a private network).
    nodes: int = 1
    #: CPU pods: RunPod CPU flavor.
    cpu_flavor: str = "cpu3c"
    #: CPU pods: vCPUs.
    vcpus: int = 4
    #: Container image; it must bring torch at olmx's pin (the bootstrap checks it).
    image: str = DEFAULT_IMAGE
    #: Only hosts whose driver supports at least this CUDA version (the image's build needs it).
    min_cuda_version: Optional[str] = "13.0"
    #: Prebuilt flash-attn wheel installed on the pod (``{python_tag}`` is filled in there);
    #: null: none. Never built from source.
    flash_attn_wheel: Optional[str] = DEFAULT_FLASH_ATTN_WHEEL
    #: Container disk in GB: local NVMe holding the run (wiped when the pod stops).
    container_disk_gb: int = 100
    #: Attach this network volume at /runpod-volume (none by default: too slow to train from).
    network_volume_id: Optional[str] = None
    #: ``SECURE`` or ``COMMUNITY`` cloud (single pods).
    cloud: str = "SECURE"
    #: Preferred data centres, in order; empty lets RunPod choose.
    data_centers: list[str] = field(default_factory=list)
    #: Environment of the pod. Saved in the plan: no secrets here (see ``pass_env``).
    env: dict[str, str] = field(default_factory=dict)
    #: Names of variables whose values are taken from this machine's environment at launch and
    #: set in the pod's environment; the values are never saved or printed.
    pass_env: list[str] = field(default_factory=list)
    #: Pod (or cluster) name; null: ``olmx-<run dir name>``.
    pod_name: Optional[str] = None
    #: Train on this existing pod instead of creating one (started if it is stopped).
    pod_id: Optional[str] = None
    #: Train on this existing instant cluster (``nodes`` > 1).
    cluster_id: Optional[str] = None
    #: Leave the pod running when the run ends (else it is stopped; a cluster is terminated).
    keep: bool = False
    #: Directory on the pod's container disk that holds the run.
    workdir: str = "/workspace/olmx"
    #: Python on the pod (the image's, which has torch).
    python: str = "python"
    #: Install olmx on the pod from the shipped source with pinned dependencies; false for an
    #: image that already has this olmx.
    install: bool = True
    #: Copy the run's data files (``data=text``/``numpy``: the files ``data.paths`` names
    #: here) to every pod, under ``<workdir>/data/`` (outside the run directory, so they are not
    #: copied back), and train on the copies; false:
    #: ``data.paths`` already name files on the pods (in the image or on a network volume).
    ship_data: bool = True
    #: Refuse to ship more than this many GB of data files (copying goes through SSH with the
    #: run); put larger data on a network volume or in the image and set ``ship_data=false``.
    ship_data_max_gb: float = 1.0
    #: SSH private key for the pods (``ssh -i``); null: ssh's defaults and agent. Its public
    #: key must be registered with RunPod.
    ssh_key: Optional[str] = None
    #: Seconds to wait for the pods to run with SSH before giving up (and terminating them).
    wait_timeout: float = 1200.0
    #: Seconds between two looks at the pods (API while starting, SSH while training).
    poll_seconds: float = 10.0


class RunPodInfra(InfraPlugin):
    """RunPod: GPU pods (an instant cluster for several nodes) made through RunPod's REST API, trained on over SSH."""

    name = "runpod"
    description = __doc__.splitlines()[0]
    api = ">=2.0,<3"
    Config = RunPodConfig

    def commands(self) -> Any:
        """``olmx provision runpod ...``."""
        from olmx_plugins.infra.runpod.commands import app

        return app()

    # -- plan --------------------------------------------------------------------------------

    def data_on_this_machine(self, cfg: RunPodConfig) -> bool:
        """Shipped data is read here first; with ``infra.ship_data=false`` it is on the pods."""
        return cfg.ship_data

    def world(self, cfg: RunPodConfig) -> World:
        """Processes from the settings; every setting that reaches RunPod is checked here."""
        from olmx.launch.devices import gpu_compute_capability
        from olmx_plugins.infra.runpod.spec import CloudType

        cfg.check()
        if cfg.nodes < 1:
            raise ConfigError("infra.nodes", f"must be at least 1, got {cfg.nodes}")
        if cfg.gpus_per_node < 0:
            raise ConfigError("infra.gpus_per_node", f"must be 0 (a CPU pod) or more, got {cfg.gpus_per_node}")
        if cfg.nodes > 1 and not cfg.gpus_per_node:
            raise ConfigError("infra.nodes", "several nodes make an instant cluster, which has GPU pods only")
        if cfg.pod_id and cfg.nodes > 1:
            raise ConfigError("infra.pod_id", f"one pod cannot hold infra.nodes={cfg.nodes}; use infra.cluster_id")
        if cfg.cluster_id and cfg.nodes < 2:
            raise ConfigError("infra.cluster_id", "a cluster has at least 2 nodes: set infra.nodes")
        if cfg.cloud not in CloudType.__members__:
            raise ConfigError("infra.cloud", f"'{cfg.cloud}' is not one of {', '.join(CloudType.__members__)}")
        for key in ("wait_timeout", "poll_seconds"):
            if getattr(cfg, key) <= 0:
                raise ConfigError(f"infra.{key}", f"must be positive, got {getattr(cfg, key)}")
        for name in cfg.env:
            if _SECRET_NAME.search(name):
                raise ConfigError(
                    "infra.env",
                    f"{name} looks like a secret, and infra.env is saved in the plan: "
                    f"list it in infra.pass_env instead (its value is taken from this environment)",
                )
        for name in cfg.pass_env:
            if not _ENV_NAME.fullmatch(name):
                raise ConfigError("infra.pass_env", f"{name!r} is not an environment variable name")
            if name == "RUNPOD_API_KEY":
                raise ConfigError("infra.pass_env", "the RunPod API key never goes to a pod")
        nproc = cfg.nproc_per_node if cfg.nproc_per_node is not None else (cfg.gpus_per_node or 2)
        if nproc < 1 or (cfg.gpus_per_node and nproc > cfg.gpus_per_node):
            raise ConfigError(
                "infra.nproc_per_node", f"{nproc} processes per pod with infra.gpus_per_node={cfg.gpus_per_node}"
            )
        self.request(cfg, name="olmx-check", env=dict(cfg.env))  # the body RunPod would get is valid
        if not cfg.gpus_per_node:
            return World(nnodes=1, nproc_per_node=nproc)
        return World(
            nnodes=cfg.nodes,
            nproc_per_node=nproc,
            device="cuda",
            device_name=cfg.gpu_type,
            compute_capability=gpu_compute_capability(cfg.gpu_type),
        )

    def spec_for(self, cfg: RunPodConfig, *, name: str, env: dict[str, str]) -> Any:
        """What to ask RunPod for: a :class:`PodSpec`, or a :class:`ClusterSpec` for several nodes."""
        from olmx_plugins.infra.runpod import spec

        common: dict[str, Any] = dict(
            name=name,
            image=cfg.image,
            container_disk_gb=cfg.container_disk_gb,
            network_volume_id=cfg.network_volume_id,
            env=env,
            data_center_ids=tuple(cfg.data_centers),
        )
        if cfg.nodes > 1:
            return spec.ClusterSpec(
                gpu_type_id=cfg.gpu_type, pod_count=cfg.nodes, gpus_per_pod=cfg.gpus_per_node, **common
            )
        return spec.PodSpec(
            gpu_type_id=cfg.gpu_type,
            gpu_count=cfg.gpus_per_node,
            min_cuda_version=cfg.min_cuda_version,
            cpu_flavor_id=cfg.cpu_flavor,
            vcpu_count=cfg.vcpus,
            cloud_type=spec.CloudType(cfg.cloud),
            **common,
        )

    def request(self, cfg: RunPodConfig, *, name: str, env: dict[str, str]) -> tuple[str, dict[str, Any]]:
        """``(path, body)`` of the create request: ``POST /v2/pods`` or ``POST /v2/clusters``;
        a setting RunPod would refuse is a ConfigError naming its ``infra.`` key."""
        from olmx_plugins.infra.runpod import spec

        wanted = self.spec_for(cfg, name=name, env=env)
        try:
            if isinstance(wanted, spec.ClusterSpec):
                return spec.CLUSTERS_PATH, spec.build_cluster_request(wanted)
            return spec.PODS_PATH, spec.build_pod_request(wanted)
        except ConfigError as exc:
            key = f"infra.{_SPEC_KEYS.get(exc.field, exc.field)}"
            raise ConfigError(key, str(exc).removeprefix(f"{exc.field}: ")) from None

    def preflight(self, cfg: RunPodConfig, plan: Any) -> None:
        """The API key is there (``RUNPOD_API_KEY`` or the key file), checked before the run
        directory is written; it is read, never sent or shown. (``--dry-run`` needs no key.)"""
        from olmx_plugins.infra.runpod.client import RunPodAuthError, _load_key

        try:
            _load_key(None)
        except RunPodAuthError as exc:
            raise ConfigError("infra=runpod", str(exc)) from None

    # -- dry run -----------------------------------------------------------------------------

    def dry_run(self, cfg: RunPodConfig, plan: Any) -> str:
        """The requests (key and passed secrets redacted), the bootstrap script and the SSH
        steps, in order. Sends nothing and needs no API key."""
        from olmx_plugins.infra.runpod.client import redacted_request

        shown_env = {**cfg.env, **{k: f"<redacted: ${k} of the launching environment>" for k in cfg.pass_env}}
        w = cfg.workdir
        stop = (
            "DELETE /v2/clusters/{id}  (an instant cluster cannot be stopped)"
            if cfg.nodes > 1
            else redacted_request("POST", "/v2/pods/{id}/action", {"action": "stop"})
        )
        parts = [
            "# 1. Create the pods and wait until every one runs with SSH "
            f"(GET every {cfg.poll_seconds:g} s, at most {cfg.wait_timeout:g} s)"
            if not (cfg.pod_id or cfg.cluster_id)
            else f"# 1. Use the existing "
            f"{'cluster ' + str(cfg.cluster_id) if cfg.cluster_id else 'pod ' + str(cfg.pod_id)}"
            " (started if stopped) and wait until it runs with SSH",
        ]
        if not (cfg.pod_id or cfg.cluster_id):
            path, body = self.request(cfg, name=self._name(cfg, plan), env=shown_env)
            parts.append(redacted_request("POST", path, body))
        parts += [
            f"\n# 2. Copy to {w} on every node (ssh ... 'tar -xzf - -C {w}'): run/plan.yaml (run_dir "
            f"{w}/run), bootstrap.sh, constraints.txt (the dependency pins of this olmx)"
            + (", olmx-src/" if cfg.install else "")
            + _shipped_data_note(plan, cfg)
            + (f", run/checkpoints/step{plan.resume_step} (resuming)" if plan.resume_step is not None else ""),
            "#    then start it: ssh ... 'cd {w} && NODE_RANK=<rank> NUM_NODES={n} nohup setsid bash bootstrap.sh &'. "
            "bootstrap.sh:".format(w=w, n=cfg.nodes),
            self.bootstrap(cfg, plan).rstrip("\n"),
            f"\n# 3. Follow: every {cfg.poll_seconds:g} s, copy new lines of {w}/run/metrics.jsonl and the node-0 log "
            "into the local run directory (progress bar)",
            f"# 4. Copy {w}/run (checkpoints, metrics, summary, logs) back into {plan.run_dir}",
            "# 5. " + ("Leave the pods running (infra.keep=true)" if cfg.keep else f"Stop the pods:\n{stop}"),
        ]
        return "\n".join(parts)

    def bootstrap(self, cfg: RunPodConfig, plan: Any, launch_id: str = "runpod-LAUNCH") -> str:
        """The bootstrap script every node of one launch runs (``templates/runpod/bootstrap.sh.j2``);
        ``launch_id`` names the launch in ``events.jsonl`` (each launch gets a fresh one)."""
        from olmx.launch import render_template, torchrun_env, torchrun_flags

        return render_template(
            TEMPLATE,
            workdir=cfg.workdir,
            python=cfg.python,
            nproc_per_node=plan.world.nproc_per_node,
            env=sorted(cfg.env.items()),
            torch_version=_torch_pin(),
            install=cfg.install,
            flash_attn_wheel=cfg.flash_attn_wheel if plan.world.device == "cuda" else None,
            rdzv_id=f"olmx-{Path(plan.run_dir).name}",
            torchrun_env=sorted(torchrun_env(cfg).items()),
            torchrun_flags=torchrun_flags(cfg, f"{cfg.workdir}/run"),
            launch_id=launch_id,
        )

    # -- launch ------------------------------------------------------------------------------

    def launch(self, cfg: RunPodConfig, plan: Any) -> int:
        """Provision (or reuse), ship, start, follow, copy back, stop."""
        from rich.console import Console

        from olmx_plugins.infra.runpod import remote as rm
        from olmx_plugins.infra.runpod.client import RunPodClient

        console = Console(stderr=True, highlight=False, soft_wrap=True)
        shipped_data(plan, cfg)  # refused before any pod exists
        client = RunPodClient.from_env()
        nodes, cluster_id, created = self._acquire(client, cfg, plan, console)
        remotes = [self._remote(plan, cfg, node.ssh) for node in nodes]
        RunDir(plan.run_dir).write_launch(
            {
                "infra": self.name,
                "pods": [{"id": n.id, "host": n.ssh.host, "port": n.ssh.port, "user": n.ssh.username} for n in nodes],
                "cluster_id": cluster_id,
                "created": created,
                "workdir": cfg.workdir,
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }
        )
        try:
            launch_id = f"runpod-{uuid.uuid4().hex[:12]}"
            data = self._bundle(plan, cfg, launch_id)
            for node, r in zip(nodes, remotes, strict=True):
                console.print(f"Copying the run to pod {node.id} ({r}) ...")
                rm.ship(r, cfg.workdir, data)
            for rank, r in enumerate(remotes):
                rm.start(r, cfg.workdir, rank=rank, nnodes=len(remotes))
        except BaseException as exc:
            if created:  # nothing on the pods yet: leave nothing behind
                kind, rid, command = self._resource(nodes, cluster_id)
                terminate = client.terminate_cluster if cluster_id else client.terminate_pod
                client.terminate_after_failure(kind, rid, terminate, command, exc)
                console.print(f"Terminated RunPod {kind} {rid}, which olmx had created: nothing is left running")
            raise
        console.print(f"Training started on {len(nodes)} pod(s); logs: {plan.run_dir}/logs/")
        watch = rm.Watch(remotes[0], cfg.workdir, plan.run_dir)
        watch.reset()
        outcome: BaseException | None = None
        try:
            self._follow(plan, cfg, watch, console)
        except KeyboardInterrupt:
            if not self._confirm_stop(console):
                raise RunFailed(self._still_running(plan, nodes), 130) from None
            console.print("Stopping the training ...")
            for r in remotes:
                rm.kill(r, cfg.workdir)
            _wait_ended(watch.look, cfg.poll_seconds)
            outcome = RunFailed(f"interrupted; the run can resume from its last checkpoint in {plan.run_dir}", 130)
        except RunFailed as exc:
            outcome = exc
        except LaunchError as exc:  # lost contact: keep the pods, say how to reach them
            raise LaunchError(f"{exc}\n{self._still_running(plan, nodes)}") from None
        self._finish(client, cfg, plan, nodes, remotes, cluster_id, console)
        if isinstance(outcome, RunFailed) and outcome.exit_code != 130:
            # Global rank 0 may have run on any node; its records are in the copied-back run.
            from olmx.events import outcome as run_outcome

            result = run_outcome(plan.run_dir, launch=launch_id)
            if result.state in ("stopped", "nonfinite"):
                outcome = RunFailed(
                    f"{result.message}: run the same olmx train again (trainer.run_dir={plan.run_dir}) to resume",
                    result.exit_code,
                )
        if outcome is not None:
            raise outcome
        return 0

    def _acquire(self, client: Any, cfg: RunPodConfig, plan: Any, console: Any) -> tuple[list[Any], str | None, bool]:
        """The ready nodes (rank order), the cluster id, and whether olmx created them."""
        wait = dict(timeout=cfg.wait_timeout, poll=cfg.poll_seconds)
        if (cfg.cluster_id or cfg.pod_id) and cfg.pass_env:
            console.print(
                "note: infra.pass_env reaches a pod when olmx creates it; an existing pod keeps "
                "the environment it was created with"
            )
        if cfg.cluster_id:
            console.print(f"Using RunPod cluster {cfg.cluster_id}")
            return list(client.wait_until_cluster_running(cfg.cluster_id, **wait).nodes), cfg.cluster_id, False
        if cfg.pod_id:
            pod = client.get_pod(cfg.pod_id)
            if pod.get("status") == "EXITED":
                console.print(f"Starting the stopped pod {cfg.pod_id}")
                client.start_pod(cfg.pod_id)
            console.print(f"Using RunPod pod {cfg.pod_id}")
            return [client.wait_until_running(cfg.pod_id, **wait)], None, False
        env = self.pod_env(cfg)
        self.request(cfg, name=self._name(cfg, plan), env=env)  # checked before anything is created
        console.print(
            f"Creating a RunPod {'cluster' if cfg.nodes > 1 else 'pod'} ({_what(cfg)}) and waiting until it runs ..."
        )
        with console.status("waiting for RunPod"):
            ready = client.provision(self.spec_for(cfg, name=self._name(cfg, plan), env=env), **wait)
        if hasattr(ready, "nodes"):
            return list(ready.nodes), ready.id, True
        return [ready], None, True

    def _bundle(self, plan: Any, cfg: RunPodConfig, launch_id: str = "runpod-LAUNCH") -> bytes:
        """What goes to every node: the pod's plan, the bootstrap, the pins, the source, and
        the checkpoint a resumed run starts from (with its metrics)."""
        import yaml

        from olmx_plugins.infra.runpod import remote as rm

        run_dir = f"{cfg.workdir}/run"
        data_files = shipped_data(plan, cfg)
        data = plan.run.data
        if data_files:
            data = replace(data, paths=[f"{cfg.workdir}/{name}" for name in data_files])
        run = replace(plan.run, trainer=replace(plan.run.trainer, run_dir=run_dir), data=data)
        pod_plan = replace(plan, run_dir=run_dir, run=run)
        files = {
            "run/plan.yaml": yaml.safe_dump(pod_plan.to_dict(), sort_keys=False).encode(),
            "bootstrap.sh": self.bootstrap(cfg, plan, launch_id).encode(),
            "constraints.txt": "".join(f"{r}\n" for r in pinned_requirements()).encode(),
        }
        trees: list[tuple[str, Path]] = list(data_files.items())
        if cfg.install:
            root = rm.source_root()
            trees += [(f"olmx-src/{part}", root / part) for part in rm.SOURCE_PARTS]
        if plan.resume_step is not None:
            local = RunDir(plan.run_dir)
            trees.append((f"run/checkpoints/step{plan.resume_step}", local.checkpoints / f"step{plan.resume_step}"))
            if local.metrics.exists():
                files["run/metrics.jsonl"] = local.metrics.read_bytes()
        return rm.bundle(files, trees)

    def _follow(self, plan: Any, cfg: RunPodConfig, watch: Any, console: Any) -> None:
        """The progress bar until node 0's bootstrap ends; RunFailed with its log tail when
        it failed. Up to 5 failed looks in a row are tolerated (a flaky connection)."""
        from olmx.launch.monitor import follow

        state: dict[str, Any] = {"last": float("-inf"), "errors": 0, "code": None}

        def poll() -> int | None:
            if time.monotonic() - state["last"] < cfg.poll_seconds:
                return None
            state["last"] = time.monotonic()
            try:
                state["code"] = watch.look()
                state["errors"] = 0
            except LaunchError:
                state["errors"] += 1
                if state["errors"] >= 5:
                    raise
            return state["code"]

        follow(plan, poll, log_path=watch.log, console=console, interval=min(0.5, cfg.poll_seconds))

    def _finish(
        self,
        client: Any,
        cfg: RunPodConfig,
        plan: Any,
        nodes: list[Any],
        remotes: list[Any],
        cluster_id: str | None,
        console: Any,
    ) -> None:
        """Copy the run back from every node (node 0 last), then stop the pods unless kept."""
        from olmx_plugins.infra.runpod import remote as rm

        console.print(f"Copying the run directory back into {plan.run_dir} ...")
        try:
            for r in reversed(remotes):
                rm.fetch(r, cfg.workdir, plan.run_dir)
        except LaunchError as exc:
            raise LaunchError(
                f"{exc}\nThe pods are left running so that nothing is lost. {self._still_running(plan, nodes)}"
            ) from None
        _localize_summary(plan.run_dir)
        if cfg.keep:
            console.print(
                "Pods kept running (infra.keep=true): "
                + "; ".join(f"{n.id}: {' '.join(n.ssh.command())}" for n in nodes)
                + f". Stop with: olmx provision runpod stop {nodes[0].id}"
            )
            return
        if cluster_id:
            client.terminate_cluster(cluster_id)
            console.print(f"Terminated RunPod cluster {cluster_id} (clusters cannot be stopped)")
        else:
            client.stop_pod(nodes[0].id)
            console.print(
                f"Stopped RunPod pod {nodes[0].id} (olmx provision runpod terminate {nodes[0].id} deletes it)"
            )

    def _confirm_stop(self, console: Any) -> bool:
        if sys.stdin is None or not sys.stdin.isatty():
            return False
        from rich.prompt import Confirm

        try:
            return Confirm.ask(
                "\nStop the training (the run is copied back and the pods stopped)?", default=False, console=console
            )
        except (KeyboardInterrupt, EOFError):
            return False

    def _still_running(self, plan: Any, nodes: list[Any]) -> str:
        return (
            f"The training keeps running on pod(s) {', '.join(n.id for n in nodes)}. Status: olmx jobs status "
            f"{plan.run_dir}; log: olmx jobs logs {plan.run_dir}; stop it, copy the run back and stop the pods: "
            f"olmx jobs cancel {plan.run_dir}"
        )

    # -- olmx jobs ---------------------------------------------------------------------------

    def job_status(self, cfg: RunPodConfig, plan: Any) -> str:
        """The pods' RunPod status, and the training's state and last step on node 0."""
        from olmx_plugins.infra.runpod import remote as rm
        from olmx_plugins.infra.runpod.client import RunPodClient

        record = RunDir(plan.run_dir).read_launch("RunPod")
        client = RunPodClient.from_env()
        lines = [f"RunPod pod {pod['id']}: {client.get_pod(pod['id']).get('status', '?')}" for pod in record["pods"]]
        try:
            code, last = rm.state(self._record_remotes(plan, cfg, record)[0], cfg.workdir)
        except LaunchError as exc:
            return "\n".join([*lines, f"training: cannot look ({exc})"])
        lines.append("training: running" if code is None else f"training: ended with exit status {code}")
        if last:
            loss = f", loss {last['loss']:.4f}" if last.get("loss") is not None else ""
            lines.append(f"progress: step {last['step']}/{plan.run.trainer.max_steps}{loss}")
        return "\n".join(lines)

    def job_logs(self, cfg: RunPodConfig, plan: Any, lines: int) -> str:
        """The end of node 0's log, read on the pod."""
        import shlex

        record = RunDir(plan.run_dir).read_launch("RunPod")
        r = self._record_remotes(plan, cfg, record)[0]
        log = shlex.quote(f"{cfg.workdir}/run/logs/node0.log")
        return r.run(f"tail -n {int(lines)} {log}", what="reading the log").decode(errors="replace")

    def job_cancel(self, cfg: RunPodConfig, plan: Any) -> None:
        """Stop the training, copy the run back, stop the pods (unless ``infra.keep``)."""
        from rich.console import Console

        from olmx_plugins.infra.runpod import remote as rm
        from olmx_plugins.infra.runpod.client import ReadyPod, RunPodClient, SshEndpoint

        record = RunDir(plan.run_dir).read_launch("RunPod")
        remotes = self._record_remotes(plan, cfg, record)
        for r in remotes:
            rm.kill(r, cfg.workdir)
        _wait_ended(lambda: rm.state(remotes[0], cfg.workdir)[0], cfg.poll_seconds)
        nodes = [ReadyPod(p["id"], "", SshEndpoint(p["host"], p["port"], p["user"]), {}) for p in record["pods"]]
        self._finish(
            RunPodClient.from_env(),
            cfg,
            plan,
            nodes,
            remotes,
            record.get("cluster_id"),
            Console(stderr=True, highlight=False, soft_wrap=True),
        )

    # -- helpers -----------------------------------------------------------------------------

    def _remote(self, plan: Any, cfg: RunPodConfig, ssh: Any) -> Any:
        from olmx_plugins.infra.runpod.remote import Remote

        key = os.path.expanduser(cfg.ssh_key) if cfg.ssh_key else None
        return Remote(ssh.host, ssh.port, ssh.username, key, str(Path(plan.run_dir) / KNOWN_HOSTS))

    def _record_remotes(self, plan: Any, cfg: RunPodConfig, record: dict[str, Any]) -> list[Any]:
        from olmx_plugins.infra.runpod.client import SshEndpoint

        return [self._remote(plan, cfg, SshEndpoint(p["host"], p["port"], p["user"])) for p in record["pods"]]

    @staticmethod
    def _resource(nodes: list[Any], cluster_id: str | None) -> tuple[str, str, str]:
        from olmx_plugins.infra.runpod.client import TERMINATE_CLUSTER_COMMAND, TERMINATE_POD_COMMAND

        if cluster_id:
            return "cluster", cluster_id, TERMINATE_CLUSTER_COMMAND.format(id=cluster_id)
        return "pod", nodes[0].id, TERMINATE_POD_COMMAND.format(id=nodes[0].id)

    @staticmethod
    def pod_env(cfg: RunPodConfig) -> dict[str, str]:
        """The pod's environment: ``env`` plus the values of ``pass_env`` from this environment."""
        missing = [k for k in cfg.pass_env if k not in os.environ]
        if missing:
            raise ConfigError("infra.pass_env", f"{', '.join(missing)} not set in this environment")
        return {**cfg.env, **{k: os.environ[k] for k in cfg.pass_env}}

    @staticmethod
    def _name(cfg: RunPodConfig, plan: Any) -> str:
        return cfg.pod_name or f"olmx-{Path(plan.run_dir).name}"


def _what(cfg: RunPodConfig) -> str:
    if not cfg.gpus_per_node:
        return f"CPU {cfg.cpu_flavor} x {cfg.vcpus} vCPUs"
    return f"{cfg.nodes} x {cfg.gpus_per_node} {cfg.gpu_type}"


def _torch_pin() -> str:
    """The torch version olmx pins (its ``torch==X`` requirement)."""
    from importlib import metadata

    from packaging.requirements import Requirement

    for text in metadata.requires("olmx") or []:
        req = Requirement(text)
        if req.name == "torch" and not req.marker:
            pins = [s.version for s in req.specifier if s.operator == "=="]
            if pins:
                return pins[0]
    raise LaunchError("the installed olmx does not pin torch (torch==X in its requirements)")


def pinned_requirements() -> list[str]:
    """``name==version`` of every installed distribution olmx needs (its dependency closure
    in this environment), except torch and its CUDA/triton companions, which the image brings."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen: dict[str, str] = {}
    todo = ["olmx"]
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        seen[name] = dist.version
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    skip = re.compile(r"^(olmx|torch|triton|nvidia-.*|pytorch-triton.*)$")
    return sorted(f"{n}=={v}" for n, v in seen.items() if not skip.match(n) and "+" not in v)


def _wait_ended(look: Any, poll: float, timeout: float = 120.0) -> None:
    """Wait until ``look()`` reports an exit status (the bootstrap ended after a SIGTERM)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if look() is not None:
                return
        except LaunchError:
            pass
        time.sleep(min(poll, 2.0))


def shipped_data(plan: Any, cfg: RunPodConfig) -> dict[str, Path]:
    """The local data files shipped to the pods, by their name under the pod's ``infra.workdir``
    (``data/000-name``, in ``data.paths`` order); ConfigError above ``infra.ship_data_max_gb``."""
    from olmx.worker.data import text_files

    data = plan.run.data
    if not cfg.ship_data or data.name == "stdlib":
        return {}
    files = text_files(list(data.paths))
    total = sum(f.stat().st_size for f in files)
    if total > cfg.ship_data_max_gb * 1e9:
        raise ConfigError(
            "infra.ship_data_max_gb",
            f"data.paths hold {total / 1e9:.1f} GB, more than the "
            f"{cfg.ship_data_max_gb:g} GB olmx copies to pods over SSH; put the data on a network "
            "volume (infra.network_volume_id) or in the image and set infra.ship_data=false",
        )
    return {f"data/{i:03d}-{f.name}": f for i, f in enumerate(files)}


def _shipped_data_note(plan: Any, cfg: RunPodConfig) -> str:
    """What the dry run says about shipped data files ('' when none are shipped)."""
    files = shipped_data(plan, cfg)
    if not files:
        return ""
    return f", data/ ({len(files)} data file(s), {sum(f.stat().st_size for f in files.values()) / 1e6:.1f} MB)"


def _localize_summary(run_dir: str) -> None:
    """The copied ``summary.json`` names the pod's run directory; name the local one."""
    path = RunDir(run_dir).summary
    if path.exists():
        summary = json.loads(path.read_text())
        summary["run_dir"] = str(run_dir)
        path.write_text(json.dumps(summary, indent=2) + "\n")


RUNPOD = RunPodInfra()

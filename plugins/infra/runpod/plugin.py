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

This module holds the plugin and its hooks; its settings are :mod:`.config`, what it ships to
the pods :mod:`.payload`, its SSH steps :mod:`.remote`, and its RunPod client
:mod:`.provision` (over :mod:`.rest` and :mod:`.transport`).
"""

from __future__ import annotations

import os
import re
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from olmx.api import InfraPlugin, World
from olmx.errors import ConfigError, LaunchError, RunFailed
from olmx.rundir import RunDir
from olmx_plugins.infra.runpod.config import RunPodConfig
from olmx_plugins.infra.runpod.payload import build_bundle, render_bootstrap, shipped_data, shipped_data_note

#: Folder of the run's known-hosts files (pods' host keys), one file per launch.
KNOWN_HOSTS_DIR = ".ssh"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: What olmx accepts as a RunPod secret's name (``{{ RUNPOD_SECRET_<name> }}``).
_SECRET_NAME = re.compile(r"[A-Za-z0-9_-]+")
#: Spec field -> config key, for errors raised while building a request body.
_SPEC_KEYS = {
    "gpu_count": "gpus_per_node",
    "gpus_per_pod": "gpus_per_node",
    "pod_count": "nodes",
    "gpu_type_id": "gpu_type",
    "cpu_flavor_id": "cpu_flavor",
    "vcpu_count": "vcpus",
}


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
        self.candidates(cfg, name="olmx-check", env={**self.pod_env(cfg, values=False)})
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

    def spec_for(
        self,
        cfg: RunPodConfig,
        *,
        name: str,
        env: dict[str, str],
        gpu_type: str | None = None,
        data_center: str | None = None,
    ) -> Any:
        """What to ask RunPod for: a :class:`PodSpec`, or a :class:`ClusterSpec` for several
        nodes; ``gpu_type`` and ``data_center`` pick one candidate (default: the first GPU
        type, and ``data_centers`` as a whole)."""
        from olmx_plugins.infra.runpod import spec

        common: dict[str, Any] = dict(
            name=name,
            image=cfg.image,
            container_disk_gb=cfg.container_disk_gb,
            network_volume_id=cfg.network_volume_id,
            env=env,
            data_center_ids=(data_center,) if data_center else tuple(cfg.data_centers),
        )
        gpu_type = gpu_type or cfg.gpu_type
        if cfg.nodes > 1:
            return spec.ClusterSpec(gpu_type_id=gpu_type, pod_count=cfg.nodes, gpus_per_pod=cfg.gpus(), **common)
        return spec.PodSpec(
            gpu_type_id=gpu_type,
            gpu_count=cfg.gpus(),
            min_cuda_version=cfg.min_cuda_version,
            cpu_flavor_id=cfg.cpu_flavor,
            vcpu_count=cfg.vcpus,
            cloud_type=spec.CloudType(cfg.cloud),
            **common,
        )

    def candidates(self, cfg: RunPodConfig, *, name: str, env: dict[str, str]) -> list[tuple[str, Any]]:
        """``(label, spec)`` of every create olmx tries, in order, until RunPod has capacity:
        each GPU type (``gpu_type``, then ``gpu_types``) in each data centre of
        ``data_centers`` (or wherever RunPod chooses). Each request body is checked here; a
        setting RunPod would refuse is a ConfigError naming its ``infra.`` key."""
        gpu_types = cfg.gpu_candidates() if cfg.gpus() else [cfg.gpu_type]
        centres: list[str | None] = list(dict.fromkeys(cfg.data_centers)) or [None]
        out = []
        for gpu_type in gpu_types:
            for centre in centres:
                wanted = self.spec_for(cfg, name=name, env=env, gpu_type=gpu_type, data_center=centre)
                self._body(wanted)
                what = f"{cfg.gpus()} x {gpu_type}" if cfg.gpus() else f"CPU {cfg.cpu_flavor} x {cfg.vcpus} vCPUs"
                out.append((f"{what} in {centre or 'any data centre'}", wanted))
        return out

    def request(self, cfg: RunPodConfig, *, name: str, env: dict[str, str]) -> tuple[str, dict[str, Any]]:
        """``(path, body)`` of the first create request: ``POST /v2/pods`` or ``POST /v2/clusters``;
        a setting RunPod would refuse is a ConfigError naming its ``infra.`` key."""
        return self._body(self.candidates(cfg, name=name, env=env)[0][1])

    @staticmethod
    def _body(wanted: Any) -> tuple[str, dict[str, Any]]:
        from olmx_plugins.infra.runpod import spec

        try:
            if isinstance(wanted, spec.ClusterSpec):
                return spec.CLUSTERS_PATH, spec.build_cluster_request(wanted)
            return spec.PODS_PATH, spec.build_pod_request(wanted)
        except ConfigError as exc:
            key = f"infra.{_SPEC_KEYS.get(exc.field, exc.field)}"
            raise ConfigError(key, str(exc).removeprefix(f"{exc.field}: ")) from None

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
            tries = self.candidates(cfg, name=self._name(cfg, plan), env=self.pod_env(cfg, values=False))
            if len(tries) > 1:
                parts.append(
                    "#    Asked in this order until RunPod has capacity (an answer 400 moves on to the "
                    "next): " + "; ".join(f"{i}. {label}" for i, (label, _) in enumerate(tries, 1))
                )
            if note := self.stored_env_note(cfg):
                parts.append(f"#    Note: {note}")
            path, body = self._body(tries[0][1])
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

    # -- launch ------------------------------------------------------------------------------

    def launch(self, cfg: RunPodConfig, plan: Any) -> int:
        """Provision (or reuse), ship, start, follow, copy back, stop."""
        from olmx.console import make_console
        from olmx_plugins.infra.runpod import remote as rm
        from olmx_plugins.infra.runpod.provision import RunPodClient

        console = make_console(stderr=True)
        shipped_data(plan, cfg)  # refused before any pod exists
        client = RunPodClient.from_env()
        nodes, cluster_id, created = self._acquire(client, cfg, plan, console)
        launch_id = f"runpod-{uuid.uuid4().hex[:12]}"
        known_hosts = self._known_hosts(plan, launch_id)
        remotes = [self._remote(cfg, node.ssh, known_hosts) for node in nodes]
        RunDir(plan.run_dir).write_launch(
            {
                "infra": self.name,
                "pods": [{"id": n.id, "host": n.ssh.host, "port": n.ssh.port, "user": n.ssh.username} for n in nodes],
                "cluster_id": cluster_id,
                "created": created,
                "workdir": cfg.workdir,
                "launch_id": launch_id,
                "known_hosts": known_hosts,
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }
        )
        try:
            for node, r in zip(nodes, remotes, strict=True):
                seconds, tries = rm.wait_for_ssh(r, timeout=cfg.ssh_wait_timeout, poll=min(cfg.poll_seconds, 5.0))
                console.print(f"SSH on pod {node.id} ({r}) answered after {seconds:.1f} s ({tries} tries)")
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
            rm.wait_ended(watch.look, cfg.poll_seconds)
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
        name = self._name(cfg, plan)
        tries = self.candidates(cfg, name=name, env=env)  # checked before anything is created
        if note := self.stored_env_note(cfg):
            console.print(f"note: {note}")
        kind = "cluster" if cfg.nodes > 1 else "pod"
        console.print(f"Creating a RunPod {kind} ({_what(cfg)}) and waiting until it runs ...")
        with console.status("waiting for RunPod"):
            ready = client.provision_first(
                tries,
                on_miss=lambda label, why: console.print(
                    f"RunPod has no {label} for this {kind} now ({why}); trying the next"
                ),
                **wait,
            )
        if hasattr(ready, "nodes"):
            return list(ready.nodes), ready.id, True
        return [ready], None, True

    def _bundle(self, plan: Any, cfg: RunPodConfig, launch_id: str = "runpod-LAUNCH") -> bytes:
        """What goes to every node (:func:`.payload.build_bundle`)."""
        return build_bundle(plan, cfg, launch_id)

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
        rm.localize_summary(plan.run_dir)
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
        from olmx_plugins.infra.runpod.provision import RunPodClient

        record = RunDir(plan.run_dir).read_launch("RunPod")
        client = RunPodClient.from_env()
        lines = [f"RunPod pod {pod['id']}: {client.get_pod(pod['id']).get('status', '?')}" for pod in record["pods"]]
        try:
            code, last = rm.state(self._record_remotes(plan, cfg, record, client)[0], cfg.workdir)
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
        from olmx.console import make_console
        from olmx_plugins.infra.runpod import remote as rm
        from olmx_plugins.infra.runpod.provision import ReadyPod, RunPodClient
        from olmx_plugins.infra.runpod.rest import SshEndpoint

        record = RunDir(plan.run_dir).read_launch("RunPod")
        client = RunPodClient.from_env()
        remotes = self._record_remotes(plan, cfg, record, client)
        for r in remotes:
            rm.kill(r, cfg.workdir)
        rm.wait_ended(lambda: rm.state(remotes[0], cfg.workdir)[0], cfg.poll_seconds)
        nodes = [ReadyPod(p["id"], "", SshEndpoint(p["host"], p["port"], p["user"]), {}) for p in record["pods"]]
        self._finish(
            client,
            cfg,
            plan,
            nodes,
            remotes,
            record.get("cluster_id"),
            make_console(stderr=True),
        )

    # -- helpers -----------------------------------------------------------------------------

    @staticmethod
    def _known_hosts(plan: Any, launch_id: str) -> str:
        """The launch's own known-hosts file: a resumed run on a new pod may get an IP:port
        that an earlier pod had, with another host key."""
        folder = Path(plan.run_dir) / KNOWN_HOSTS_DIR
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        return str(folder / f"known_hosts-{launch_id}")

    @staticmethod
    def _remote(cfg: RunPodConfig, ssh: Any, known_hosts: str) -> Any:
        from olmx_plugins.infra.runpod.remote import Remote

        key = os.path.expanduser(cfg.ssh_key) if cfg.ssh_key else None
        return Remote(ssh.host, ssh.port, ssh.username, key, known_hosts)

    def _record_remotes(self, plan: Any, cfg: RunPodConfig, record: dict[str, Any], client: Any = None) -> list[Any]:
        """The pods of the launch record, at their SSH endpoints now: a pod that RunPod
        restarted may have a new IP and port, which are written back to ``launch.json``."""
        from olmx_plugins.infra.runpod.rest import SshEndpoint, ssh_endpoint

        if client is None:
            from olmx_plugins.infra.runpod.provision import RunPodClient

            client = RunPodClient.from_env()
        changed = []
        for pod in record["pods"]:
            now = ssh_endpoint(client.get_pod(pod["id"]))
            if now is not None and (now.host, now.port) != (pod["host"], pod["port"]):
                changed.append(f"pod {pod['id']}: {pod['host']}:{pod['port']} -> {now.host}:{now.port}")
                pod.update(host=now.host, port=now.port, user=now.username)
        if changed:
            RunDir(plan.run_dir).write_launch(record)
            from olmx.console import make_console

            make_console(stderr=True).print(
                f"note: RunPod moved the SSH endpoint ({'; '.join(changed)}); launch.json updated"
            )
        known_hosts = record.get("known_hosts") or self._known_hosts(plan, str(record.get("launch_id", "unknown")))
        return [self._remote(cfg, SshEndpoint(p["host"], p["port"], p["user"]), known_hosts) for p in record["pods"]]

    @staticmethod
    def _resource(nodes: list[Any], cluster_id: str | None) -> tuple[str, str, str]:
        from olmx_plugins.infra.runpod.provision import TERMINATE_CLUSTER_COMMAND, TERMINATE_POD_COMMAND

        if cluster_id:
            return "cluster", cluster_id, TERMINATE_CLUSTER_COMMAND.format(id=cluster_id)
        return "pod", nodes[0].id, TERMINATE_POD_COMMAND.format(id=nodes[0].id)

    @staticmethod
    def pod_env(cfg: RunPodConfig, *, values: bool = True) -> dict[str, str]:
        """The pod's environment: ``env``, the RunPod secret references of ``secrets``, and
        the values of ``pass_env`` from this environment (with ``values=False``, a redacted
        placeholder for each: what the plan and the dry run show)."""
        refs = {name: f"{{{{ RUNPOD_SECRET_{secret} }}}}" for name, secret in cfg.secrets.items()}
        if not values:
            shown = {k: f"<redacted: ${k} of the launching environment>" for k in cfg.pass_env}
            return {**cfg.env, **refs, **shown}
        missing = [k for k in cfg.pass_env if k not in os.environ]
        if missing:
            raise ConfigError("infra.pass_env", f"{', '.join(missing)} not set in this environment")
        return {**cfg.env, **refs, **{k: os.environ[k] for k in cfg.pass_env}}

    @staticmethod
    def stored_env_note(cfg: RunPodConfig) -> str:
        """Which variables RunPod stores in plain text with the pod ('' when none are secret)."""
        if not cfg.pass_env:
            return ""
        return (
            f"RunPod stores the pod's environment and returns it on every GET of the pod: the values of "
            f"{', '.join(cfg.pass_env)} (infra.pass_env) are kept there in plain text. For tokens, prefer "
            "RunPod secrets (infra.secrets.NAME=<secret name>), which only the pod sees"
        )

    @staticmethod
    def _name(cfg: RunPodConfig, plan: Any) -> str:
        return cfg.pod_name or f"olmx-{Path(plan.run_dir).name}"


def _what(cfg: RunPodConfig) -> str:
    if not cfg.gpus():
        return f"CPU {cfg.cpu_flavor} x {cfg.vcpus} vCPUs"
    return f"{cfg.nodes} x {cfg.gpus()} {cfg.gpu_type}"


def _sm(capability: tuple[int, int] | None) -> str:
    return f"SM{capability[0]}{capability[1]}" if capability else "unknown"


RUNPOD = RunPodInfra()

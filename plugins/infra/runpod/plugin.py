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

#: Local known-hosts file of the run (pods' host keys).
KNOWN_HOSTS = ".ssh_known_hosts"
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
        from olmx_plugins.infra.runpod.transport import looks_secret

        for name in cfg.env:
            if looks_secret(name):
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
        # The body RunPod would get is valid (pass_env's values are only known at launch).
        self.request(cfg, name="olmx-check", env={**cfg.env, **dict.fromkeys(cfg.pass_env, "")})
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
        from olmx_plugins.infra.runpod.errors import RunPodAuthError
        from olmx_plugins.infra.runpod.transport import _load_key

        try:
            _load_key(None)
        except RunPodAuthError as exc:
            raise ConfigError("infra=runpod", str(exc)) from None

    # -- dry run -----------------------------------------------------------------------------

    def dry_run(self, cfg: RunPodConfig, plan: Any) -> str:
        """The requests (key and passed secrets redacted), the bootstrap script and the SSH
        steps, in order. Sends nothing and needs no API key."""
        from olmx_plugins.infra.runpod.transport import redacted_request

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
            + shipped_data_note(plan, cfg)
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
        return render_bootstrap(cfg, plan, launch_id)

    # -- launch ------------------------------------------------------------------------------

    def launch(self, cfg: RunPodConfig, plan: Any) -> int:
        """Provision (or reuse), ship, start, follow, copy back, stop."""
        from rich.console import Console

        from olmx_plugins.infra.runpod import remote as rm
        from olmx_plugins.infra.runpod.provision import RunPodClient

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
        from olmx_plugins.infra.runpod.provision import ReadyPod, RunPodClient
        from olmx_plugins.infra.runpod.rest import SshEndpoint

        record = RunDir(plan.run_dir).read_launch("RunPod")
        remotes = self._record_remotes(plan, cfg, record)
        for r in remotes:
            rm.kill(r, cfg.workdir)
        rm.wait_ended(lambda: rm.state(remotes[0], cfg.workdir)[0], cfg.poll_seconds)
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
        from olmx_plugins.infra.runpod.rest import SshEndpoint

        return [self._remote(plan, cfg, SshEndpoint(p["host"], p["port"], p["user"])) for p in record["pods"]]

    @staticmethod
    def _resource(nodes: list[Any], cluster_id: str | None) -> tuple[str, str, str]:
        from olmx_plugins.infra.runpod.provision import TERMINATE_CLUSTER_COMMAND, TERMINATE_POD_COMMAND

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


RUNPOD = RunPodInfra()

"""The launch of a run on RunPod, step by step: get the pods (create them, trying each candidate
until RunPod has capacity, or reuse ``infra.pod_id`` / ``infra.cluster_id``), record them
(``launch.json``), wait for SSH, ship the run, start the bootstrap on every node, follow node
0's progress, copy the run back (node 0 last) and stop or terminate the pods; and ``olmx jobs
status|logs|cancel`` on a launched run. The plugin class (:mod:`.plugin`) calls these; the SSH
steps are :mod:`.remote`, the RunPod client :mod:`.provision`."""

from __future__ import annotations

import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from olmx.errors import LaunchError, RunFailed
from olmx.rundir import RunDir
from olmx_plugins.infra.runpod.config import RunPodConfig
from olmx_plugins.infra.runpod.creation import candidates, describe, pod_env, pod_name, stored_env_note
from olmx_plugins.infra.runpod.payload import build_bundle, shipped_data

#: Folder of the run's known-hosts files (pods' host keys), one file per launch.
KNOWN_HOSTS_DIR = ".ssh"


def launch(cfg: RunPodConfig, plan: Any) -> int:
    """Provision (or reuse), ship, start, follow, copy back, stop."""
    from olmx.console import make_console
    from olmx_plugins.infra.runpod import remote as rm
    from olmx_plugins.infra.runpod.provision import RunPodClient

    console = make_console(stderr=True)
    shipped_data(plan, cfg)  # refused before any pod exists
    client = RunPodClient.from_env()
    nodes, cluster_id, created = acquire_nodes(client, cfg, plan, console)
    launch_id = f"runpod-{uuid.uuid4().hex[:12]}"
    known_hosts = known_hosts_file(plan, launch_id)
    remotes = [remote_for(cfg, node.ssh, known_hosts) for node in nodes]
    RunDir(plan.run_dir).write_launch(
        {
            "infra": "runpod",
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
        data = build_bundle(plan, cfg, launch_id)
        for node, r in zip(nodes, remotes, strict=True):
            console.print(f"Copying the run to pod {node.id} ({r}) ...")
            rm.ship(r, cfg.workdir, data)
        for rank, r in enumerate(remotes):
            rm.start(r, cfg.workdir, rank=rank, nnodes=len(remotes))
    except BaseException as exc:
        if created:  # nothing on the pods yet: leave nothing behind
            kind, rid, command = resource(nodes, cluster_id)
            terminate = client.terminate_cluster if cluster_id else client.terminate_pod
            client.terminate_after_failure(kind, rid, terminate, command, exc)
            console.print(f"Terminated RunPod {kind} {rid}, which olmx had created: nothing is left running")
        raise
    console.print(f"Training started on {len(nodes)} pod(s); logs: {plan.run_dir}/logs/")
    watch = rm.Watch(remotes[0], cfg.workdir, plan.run_dir)
    watch.reset()
    outcome: BaseException | None = None
    try:
        follow_run(plan, cfg, watch, console)
    except KeyboardInterrupt:
        if not confirm_stop(console):
            raise RunFailed(still_running(plan, nodes), 130) from None
        console.print("Stopping the training ...")
        for r in remotes:
            rm.kill(r, cfg.workdir)
        rm.wait_ended(watch.look, cfg.poll_seconds)
        outcome = RunFailed(f"interrupted; the run can resume from its last checkpoint in {plan.run_dir}", 130)
    except RunFailed as exc:
        outcome = exc
    except LaunchError as exc:  # lost contact: keep the pods, say how to reach them
        raise LaunchError(f"{exc}\n{still_running(plan, nodes)}") from None
    finish(client, cfg, plan, nodes, remotes, cluster_id, console)
    if isinstance(outcome, RunFailed) and outcome.exit_code != 130:
        # Global rank 0 may have run on any node; its records are in the copied-back run.
        from olmx.events import outcome as run_outcome

        result = run_outcome(plan.run_dir, launch=launch_id)
        if result.state in ("stopped", "nonfinite", "hang"):
            outcome = RunFailed(
                f"{result.message}: run the same olmx train again (trainer.run_dir={plan.run_dir}) to resume",
                result.exit_code,
            )
    if outcome is not None:
        raise outcome
    return 0


def acquire_nodes(client: Any, cfg: RunPodConfig, plan: Any, console: Any) -> tuple[list[Any], str | None, bool]:
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
    env = pod_env(cfg)
    name = pod_name(cfg, plan)
    tries = candidates(cfg, name=name, env=env)  # checked before anything is created
    if note := stored_env_note(cfg):
        console.print(f"note: {note}")
    kind = "cluster" if cfg.nodes > 1 else "pod"
    console.print(f"Creating a RunPod {kind} ({describe(cfg)}) and waiting until it runs ...")
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


def follow_run(plan: Any, cfg: RunPodConfig, watch: Any, console: Any) -> None:
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


def finish(
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
            f"{exc}\nThe pods are left running so that nothing is lost. {still_running(plan, nodes)}"
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
        console.print(f"Stopped RunPod pod {nodes[0].id} (olmx provision runpod terminate {nodes[0].id} deletes it)")


def confirm_stop(console: Any) -> bool:
    if sys.stdin is None or not sys.stdin.isatty():
        return False
    from rich.prompt import Confirm

    try:
        return Confirm.ask(
            "\nStop the training (the run is copied back and the pods stopped)?", default=False, console=console
        )
    except (KeyboardInterrupt, EOFError):
        return False


def still_running(plan: Any, nodes: list[Any]) -> str:
    return (
        f"The training keeps running on pod(s) {', '.join(n.id for n in nodes)}. Status: olmx jobs status "
        f"{plan.run_dir}; log: olmx jobs logs {plan.run_dir}; stop it, copy the run back and stop the pods: "
        f"olmx jobs cancel {plan.run_dir}"
    )


def job_status(cfg: RunPodConfig, plan: Any) -> str:
    """The pods' RunPod status, and the training's state and last step on node 0."""
    from olmx_plugins.infra.runpod import remote as rm
    from olmx_plugins.infra.runpod.provision import RunPodClient

    record = RunDir(plan.run_dir).read_launch("RunPod")
    client = RunPodClient.from_env()
    lines = [f"RunPod pod {pod['id']}: {client.get_pod(pod['id']).get('status', '?')}" for pod in record["pods"]]
    try:
        code, last = rm.state(record_remotes(plan, cfg, record, client)[0], cfg.workdir)
    except LaunchError as exc:
        return "\n".join([*lines, f"training: cannot look ({exc})"])
    lines.append("training: running" if code is None else f"training: ended with exit status {code}")
    if last:
        loss = f", loss {last['loss']:.4f}" if last.get("loss") is not None else ""
        lines.append(f"progress: step {last['step']}/{plan.run.trainer.max_steps}{loss}")
    return "\n".join(lines)


def job_logs(cfg: RunPodConfig, plan: Any, lines: int) -> str:
    """The end of node 0's log, read on the pod."""
    import shlex

    record = RunDir(plan.run_dir).read_launch("RunPod")
    r = record_remotes(plan, cfg, record)[0]
    log = shlex.quote(f"{cfg.workdir}/run/logs/node0.log")
    return r.run(f"tail -n {int(lines)} {log}", what="reading the log").decode(errors="replace")


def job_cancel(cfg: RunPodConfig, plan: Any) -> None:
    """Stop the training, copy the run back, stop the pods (unless ``infra.keep``)."""
    from olmx.console import make_console
    from olmx_plugins.infra.runpod import remote as rm
    from olmx_plugins.infra.runpod.provision import ReadyPod, RunPodClient
    from olmx_plugins.infra.runpod.rest import SshEndpoint

    record = RunDir(plan.run_dir).read_launch("RunPod")
    client = RunPodClient.from_env()
    remotes = record_remotes(plan, cfg, record, client)
    for r in remotes:
        rm.kill(r, cfg.workdir)
    rm.wait_ended(lambda: rm.state(remotes[0], cfg.workdir)[0], cfg.poll_seconds)
    nodes = [ReadyPod(p["id"], "", SshEndpoint(p["host"], p["port"], p["user"]), {}) for p in record["pods"]]
    finish(
        client,
        cfg,
        plan,
        nodes,
        remotes,
        record.get("cluster_id"),
        make_console(stderr=True),
    )


def known_hosts_file(plan: Any, launch_id: str) -> str:
    """The launch's own known-hosts file: a resumed run on a new pod may get an IP:port
    that an earlier pod had, with another host key."""
    folder = Path(plan.run_dir) / KNOWN_HOSTS_DIR
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return str(folder / f"known_hosts-{launch_id}")


def remote_for(cfg: RunPodConfig, ssh: Any, known_hosts: str) -> Any:
    from olmx_plugins.infra.runpod.remote import Remote

    key = os.path.expanduser(cfg.ssh_key) if cfg.ssh_key else None
    return Remote(ssh.host, ssh.port, ssh.username, key, known_hosts)


def record_remotes(plan: Any, cfg: RunPodConfig, record: dict[str, Any], client: Any = None) -> list[Any]:
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
    known_hosts = record.get("known_hosts") or known_hosts_file(plan, str(record.get("launch_id", "unknown")))
    return [remote_for(cfg, SshEndpoint(p["host"], p["port"], p["user"]), known_hosts) for p in record["pods"]]


def resource(nodes: list[Any], cluster_id: str | None) -> tuple[str, str, str]:
    from olmx_plugins.infra.runpod.provision import TERMINATE_CLUSTER_COMMAND, TERMINATE_POD_COMMAND

    if cluster_id:
        return "cluster", cluster_id, TERMINATE_CLUSTER_COMMAND.format(id=cluster_id)
    return "pod", nodes[0].id, TERMINATE_POD_COMMAND.format(id=nodes[0].id)

"""``olmx provision runpod ...``: make and manage RunPod pods from the command line.

``olmx provision runpod [--dry-run] [OVERRIDES]`` composes and resolves the plan exactly as
``olmx train infra=runpod OVERRIDES`` would, creates its pod (or, with ``infra.nodes`` > 1,
its instant cluster), waits until it runs with SSH and prints how to reach it and how to
train on it. ``list``, ``status``, ``stop``, ``start``, ``terminate`` and
``terminate-cluster`` manage what exists; ``ssh-keys`` lists the account's registered SSH
keys and ``ssh-keys add FILE`` registers one. The CLI gives these commands its error handling.
"""

from __future__ import annotations

from typing import Any, Optional

import typer

from olmx.console import make_console
from olmx.errors import ConfigError

out = make_console()
err = make_console(stderr=True)


class _UpByDefault(typer.core.TyperGroup):
    """Arguments that do not start with a sub-command name go to ``up``
    (``olmx provision runpod infra.gpus_per_node=8``)."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["up", *args]
        return super().parse_args(ctx, args)


def app(infra: Any) -> typer.Typer:
    """The ``olmx provision runpod`` command group of the plugin ``infra``."""

    def up_command(
        overrides: Optional[list[str]] = typer.Argument(None, help="The run's overrides, as for olmx train."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Print the request (key redacted); send nothing."),
    ) -> None:
        """Create the pod(s) for a plan, wait until they run with SSH, print how to reach them."""
        up(infra, list(overrides or []), dry_run=dry_run)

    group = typer.Typer(
        cls=_UpByDefault,
        no_args_is_help=True,
        add_completion=False,
        help="Create and manage RunPod pods (REST API v2; key from RUNPOD_API_KEY).",
    )
    group.command("up", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(up_command)
    group.command("list")(list_all)
    group.command("status")(status)
    group.command("start")(start)
    group.command("stop")(stop)
    group.command("terminate")(terminate)
    group.command("terminate-cluster")(terminate_cluster)
    keys = typer.Typer(
        invoke_without_command=True, add_completion=False, help="The account's registered SSH public keys."
    )
    keys.callback()(ssh_keys)
    keys.command("add")(ssh_keys_add)
    group.add_typer(keys, name="ssh-keys")
    return group


def _client() -> Any:
    from olmx_plugins.infra.runpod.provision import RunPodClient

    return RunPodClient.from_env()


def up(infra: Any, overrides: list[str], *, dry_run: bool) -> None:
    """``olmx provision runpod up OVERRIDES``: create the pod(s) of the run's plan with the
    plugin ``infra``, wait until they run with SSH, print how to reach them."""
    from olmx.planning import plan_run
    from olmx_plugins.infra.runpod.creation import candidates, pod_env, pod_name, request, stored_env_note
    from olmx_plugins.infra.runpod.keys import check_ssh_keys
    from olmx_plugins.infra.runpod.provision import ReadyCluster
    from olmx_plugins.infra.runpod.transport import redacted_request

    plan = plan_run(["infra=runpod", *overrides])
    if plan.run.infra_name != "runpod":
        raise ConfigError("infra", f"olmx provision runpod provisions infra=runpod, not infra={plan.run.infra_name}")
    cfg = plan.infra
    name = pod_name(cfg, plan)
    if dry_run:
        path, body = request(cfg, name=name, env=pod_env(cfg, values=False))
        out.print(redacted_request("POST", path, body), markup=False)
        return
    env = pod_env(cfg)
    tries = candidates(cfg, name=name, env=env)
    client = _client()
    check_ssh_keys(client, cfg.ssh_key)
    if note := stored_env_note(cfg):
        err.print(f"note: {note}", markup=False)
    kind = "cluster" if cfg.nodes > 1 else "pod"
    with err.status(f"Creating RunPod {kind} {name} and waiting until it runs"):
        ready = client.provision_first(
            tries,
            on_miss=lambda label, why: err.print(f"RunPod has no {label} now ({why}); trying the next", markup=False),
            timeout=cfg.wait_timeout,
            poll=cfg.poll_seconds,
        )
    key = ["-i", cfg.ssh_key] if cfg.ssh_key else []
    train = " ".join(["olmx train", *overrides])
    if isinstance(ready, ReadyCluster):
        out.print(f"RunPod cluster [bold]{ready.id}[/] ({name}) is running:")
        for rank, node in enumerate(ready.nodes):
            out.print(f"  node {rank}: pod {node.id}: {' '.join([*node.ssh.command(), *key])}", markup=False)
        out.print(f"Train on it:  {train} infra.cluster_id={ready.id}", markup=False)
        out.print(f"Terminate it: olmx provision runpod terminate-cluster {ready.id}", markup=False)
        return
    out.print(f"RunPod pod [bold]{ready.id}[/] ({name}) is running.")
    out.print(f"Reach it:     {' '.join([*ready.ssh.command(), *key])}", markup=False)
    out.print(f"Train on it:  {train} infra.pod_id={ready.id}", markup=False)
    out.print(f"Stop it:      olmx provision runpod stop {ready.id}   (the container disk is wiped)", markup=False)
    out.print(f"Delete it:    olmx provision runpod terminate {ready.id}", markup=False)


def _row(pod: dict[str, Any]) -> list[str]:
    from olmx_plugins.infra.runpod.rest import ssh_endpoint

    gpu, cpu = pod.get("gpu") or {}, pod.get("cpu") or {}
    compute = (
        f"{gpu.get('count', 1)} x {gpu['id']}"
        if gpu.get("id")
        else (f"CPU {cpu.get('id', '?')} x {cpu.get('vcpuCount', '?')}" if cpu else "-")
    )
    ssh = ssh_endpoint(pod)
    cost = pod.get("cost")
    return [
        str(pod.get("id")),
        str(pod.get("name", "")),
        str(pod.get("status", "?")),
        compute,
        f"{cost:.2f}" if isinstance(cost, (int, float)) else "-",
        " ".join(ssh.command()) if ssh else "-",
        str((pod.get("cluster") or {}).get("id", "")),
    ]


def list_all() -> None:
    """Every pod and instant cluster of the account."""
    from rich.table import Table

    client = _client()
    pods, clusters = client.list_pods(include_cluster_pods=True), client.list_clusters()
    table = Table(title="RunPod pods")
    for col in ("id", "name", "status", "compute", "$/h", "ssh", "cluster"):
        table.add_column(col)
    for pod in pods:
        table.add_row(*_row(pod))
    out.print(table)
    if clusters:
        ctable = Table(title="RunPod instant clusters")
        for col in ("id", "name", "type", "pods"):
            ctable.add_column(col)
        for c in clusters:
            by_status = (c.get("pods") or {}).get("byStatus") or {}
            ctable.add_row(
                str(c.get("id")),
                str(c.get("name", "")),
                str(c.get("type", "")),
                ", ".join(f"{n} {s}" for s, n in by_status.items()) or "-",
            )
        out.print(ctable)


def status(pod_id: str = typer.Argument(..., help="Pod id.")) -> None:
    """One pod: status, compute, image, cost and how to reach it."""
    pod = _client().get_pod(pod_id)
    pid, name, state, compute, cost, ssh, cluster = _row(pod)
    for label, value in (
        ("pod", pid),
        ("name", name),
        ("status", state),
        ("compute", compute),
        ("image", str(pod.get("image", ""))),
        ("$/h", cost),
        ("ssh", ssh),
        ("cluster", cluster or "-"),
    ):
        out.print(f"{label:8} {value}", markup=False)


def start(pod_id: str = typer.Argument(..., help="Pod id.")) -> None:
    """Start a stopped pod."""
    pod = _client().start_pod(pod_id)
    out.print(f"pod {pod_id}: {pod.get('status', '?')}")


def stop(pod_id: str = typer.Argument(..., help="Pod id.")) -> None:
    """Stop a pod (billing for its GPUs ends; its container disk is wiped)."""
    pod = _client().stop_pod(pod_id)
    out.print(f"pod {pod_id}: {pod.get('status', '?')}")


def terminate(pod_id: str = typer.Argument(..., help="Pod id.")) -> None:
    """Terminate and delete a pod."""
    _client().terminate_pod(pod_id)
    out.print(f"pod {pod_id}: terminated")


def terminate_cluster(cluster_id: str = typer.Argument(..., help="Instant-cluster id.")) -> None:
    """Terminate an instant cluster and all its pods."""
    _client().terminate_cluster(cluster_id)
    out.print(f"cluster {cluster_id}: terminated")


def ssh_keys(ctx: typer.Context) -> None:
    """The SSH public keys registered with the RunPod account (RunPod installs them into the
    pods it creates), and which of them this machine holds."""
    if ctx.invoked_subcommand is not None:
        return
    from olmx_plugins.infra.runpod.keys import key_id, local_public_keys

    registered = _client().ssh_keys()
    local = local_public_keys(None)
    if not registered:
        out.print("No SSH public key is registered: pods olmx creates could not be reached.", markup=False)
        out.print("Register one: olmx provision runpod ssh-keys add ~/.ssh/id_ed25519.pub", markup=False)
        return
    for line in registered:
        parts = line.split()
        here = local.get(key_id(line))
        out.print(
            f"{parts[0]} ...{parts[1][-12:] if len(parts) > 1 else ''} {' '.join(parts[2:])}"
            + (f"   (here: {here})" if here else ""),
            markup=False,
        )


def ssh_keys_add(path: str = typer.Argument(..., help="A public key file (~/.ssh/id_ed25519.pub).")) -> None:
    """Register a public key with the RunPod account (added to the keys it has)."""
    import os
    import re
    from pathlib import Path

    from olmx_plugins.infra.runpod.keys import key_id

    file = Path(os.path.expanduser(path))
    try:
        line = file.read_text().strip()
    except OSError as exc:
        raise ConfigError("path", f"cannot read {file}: {exc.strerror}") from None
    if not re.fullmatch(r"(ssh|ecdsa|sk)-\S+ \S+([ \t][^\n\r]*)?", line):
        hint = " (that is a private key: give its .pub file)" if "PRIVATE KEY" in line else ""
        raise ConfigError("path", f"{file} is not one public key line ('ssh-ed25519 AAAA... comment'){hint}")
    client = _client()
    keys = client.ssh_keys()
    if key_id(line) in {key_id(k) for k in keys}:
        out.print(f"{file} is already registered ({len(keys)} key(s) in all)", markup=False)
        return
    now = client.set_ssh_keys([*keys, line])
    out.print(f"Registered {file}: the account has {len(now)} key(s); pods created from now on get them", markup=False)

"""SSH keys for RunPod pods: the account's registered keys against the ones this machine holds.

RunPod's ``startSsh`` puts the account's registered public keys into a new pod (as its
``PUBLIC_KEY``); with none registered it does nothing, and olmx would find out only once the
pod it pays for has booted. :func:`check_ssh_keys` asks RunPod first
(``GET /v2/account/ssh-keys``) and compares with the public keys of what ``ssh`` will offer:
``infra.ssh_key`` (its ``.pub`` file, or the public key ``ssh-keygen -y`` derives), else the
default identities ``~/.ssh/id_*.pub`` and the keys of a running ``ssh-agent``.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from olmx.errors import ConfigError

#: The identities OpenSSH's client tries by default, in its order.
DEFAULT_IDENTITIES = ("id_rsa", "id_ecdsa", "id_ecdsa_sk", "id_ed25519", "id_ed25519_sk")
#: The fix printed when the account lacks a key.
ADD_COMMAND = "olmx provision runpod ssh-keys add {path}"


def key_id(line: str) -> str:
    """``"<type> <base64>"`` of an ``authorized_keys``-style line (the comment dropped)."""
    return " ".join(line.split()[:2])


def local_public_keys(ssh_key: str | None) -> dict[str, str]:
    """The public keys ``ssh`` would offer, ``{key id: where it comes from}``: the public half
    of ``ssh_key`` alone when it is set, else the default identities and the agent's keys."""
    found: dict[str, str] = {}
    if ssh_key:
        private = Path(os.path.expanduser(ssh_key))
        public = Path(f"{private}.pub")
        if public.is_file():
            found[key_id(public.read_text())] = str(public)
        else:
            derived = _run(["ssh-keygen", "-y", "-P", "", "-f", str(private)])
            if derived:
                found[key_id(derived)] = f"{private} (public key derived with ssh-keygen -y)"
        return found
    home = Path(os.path.expanduser("~/.ssh"))
    for name in DEFAULT_IDENTITIES:
        public = home / f"{name}.pub"
        if public.is_file() and public.read_text().strip():
            found.setdefault(key_id(public.read_text()), str(public))
    if os.environ.get("SSH_AUTH_SOCK"):
        for line in (_run(["ssh-add", "-L"]) or "").splitlines():
            if line.strip():
                found.setdefault(key_id(line), "ssh-agent")
    return found


def check_ssh_keys(client: Any, ssh_key: str | None) -> None:
    """ConfigError (before anything is created) when the RunPod account has no registered SSH
    key, or when none of the keys this machine would offer is registered."""
    where = f"infra.ssh_key={ssh_key}" if ssh_key else "~/.ssh/id_*.pub or ssh-agent"
    local = local_public_keys(ssh_key)
    registered = {key_id(k) for k in client.ssh_keys()}
    example = next(iter(local.values()), None)
    fix = ADD_COMMAND.format(path=example if example and example.endswith(".pub") else "~/.ssh/id_ed25519.pub")
    if not registered:
        raise ConfigError(
            "infra.ssh_key",
            "the RunPod account has no registered SSH public key, so the pods olmx would create could "
            f"not be reached (RunPod's startSsh installs the account's keys). Register yours: {fix}",
        )
    if ssh_key and not local:
        raise ConfigError(
            "infra.ssh_key",
            f"{ssh_key}: no public key next to it ({ssh_key}.pub) and ssh-keygen -y could not derive one "
            "(a passphrase?); write its .pub file so that olmx can check it is registered with RunPod",
        )
    if not local:
        raise ConfigError(
            "infra.ssh_key",
            f"this machine has no SSH key to reach the pods with ({where}): create one with "
            f"ssh-keygen -t ed25519 and register it: {fix}",
        )
    if not registered & set(local):
        raise ConfigError(
            "infra.ssh_key",
            f"none of the SSH keys here ({', '.join(local.values())}) is registered with the RunPod account "
            f"({len(registered)} other key(s) are), so the pods would refuse the connection. Register one: "
            f"{fix}, or set infra.ssh_key to the private key of a registered one",
        )


def _run(argv: list[str]) -> str | None:
    """The command's stdout, or None when it is missing or fails."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=10, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None

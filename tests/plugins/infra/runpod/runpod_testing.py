"""Shared pieces of the RunPod plugin tests: a fake RunPod API with a known key, and a
stand-in ``ssh`` (fake_ssh.py) that runs "remote" commands on this machine."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_runpod import FakeRunPod

KEY = "rpa_T7Q2M9XK4LZ8PW3VB6NJ5HC1DF0GSY2E8RUP"
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def ssh_identity(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh ed25519 key pair (``id_ed25519`` and ``id_ed25519.pub`` in a ``.ssh`` folder)."""
    folder = tmp_path_factory.mktemp("home") / ".ssh"
    folder.mkdir()
    key = folder / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "olmx-test", "-f", str(key)], check=True)
    return key


@pytest.fixture
def fake(ssh_identity: Path) -> Iterator[FakeRunPod]:
    """A fake RunPod REST API v2 on 127.0.0.1 that accepts :data:`KEY`, whose account has the
    public key of :func:`ssh_identity` registered; pods start at once."""
    public = Path(f"{ssh_identity}.pub").read_text().strip()
    with FakeRunPod(api_key=KEY, polls_to_running=1, ssh_keys=[public]) as server:
        yield server


@pytest.fixture
def fake_ssh(tmp_path: Path) -> dict[str, str]:
    """Environment that puts the stand-in ``ssh`` first on PATH; its calls go to
    ``<tmp>/ssh.jsonl``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ssh = bin_dir / "ssh"
    ssh.write_text(f'#!/bin/sh\nexec {sys.executable} {HERE / "fake_ssh.py"} "$@"\n')
    ssh.chmod(0o755)
    import os

    return {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "FAKE_SSH_LOG": str(tmp_path / "ssh.jsonl"),
        "OLMX_POD_ENV_FILE": "/dev/null",
    }


def ssh_calls(env: dict[str, str]) -> list[dict]:
    """The stand-in ssh's calls so far."""
    path = Path(env["FAKE_SSH_LOG"])
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

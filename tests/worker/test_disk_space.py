"""The free-space check before training counts what OLMo-core really keeps: its
``max_checkpoints`` (3) plus the one being written, less the checkpoints already on disk."""

from __future__ import annotations

import shutil
from collections import namedtuple

import pytest
import torch

from olmx.errors import LaunchError
from olmx.worker.checkpoint import KEEP_CHECKPOINTS, METADATA, check_disk_space, checkpoint_bytes

Usage = namedtuple("Usage", "total used free")


def _checkpoints(run_dir, steps):
    for step in steps:
        d = run_dir / "checkpoints" / f"step{step}"
        d.mkdir(parents=True)
        (d / METADATA).write_text("{}")


@pytest.mark.parametrize(
    ("on_disk", "free_in_checkpoints", "refused"),
    [
        (0, KEEP_CHECKPOINTS + 0.9, True),  # the old rule (two) let this through; the 4th save fails
        (0, KEEP_CHECKPOINTS + 1.1, False),
        (2, 1.9, True),  # two held: two more must fit
        (2, 2.1, False),
        (5, 1.1, False),  # more than kept (an older attempt's): they are pruned to 3, one more must fit
    ],
)
def test_room_for_the_kept_checkpoints_and_the_next(tmp_path, monkeypatch, on_disk, free_in_checkpoints, refused):
    model = torch.nn.Linear(64, 64)
    need = checkpoint_bytes(model)
    assert need == 3 * (64 * 64 + 64) * 4  # parameters and AdamW's two moments, float32
    _checkpoints(tmp_path, [4 * (i + 1) for i in range(on_disk)])
    monkeypatch.setattr(shutil, "disk_usage", lambda _: Usage(0, 0, int(free_in_checkpoints * need)))
    if refused:
        with pytest.raises(LaunchError, match="more must fit"):
            check_disk_space(model, tmp_path)
    else:
        check_disk_space(model, tmp_path)

"""The plan's value types: the mesh checks its own structure in one place (``Mesh.validate``)."""

from __future__ import annotations

import pytest

from olmx.errors import ConfigError
from olmx.types import Mesh, World

FOUR = World(nnodes=1, nproc_per_node=4)
CLAIMED = {"cp": "parallel.ulysses", "tp": "parallel.tp", "pp": "parallel.pp", "dp": "parallel.hsdp"}


def test_a_mesh_that_covers_the_world_is_itself():
    mesh = Mesh(dp_replicate=2, dp_shard=2, ep=2, shards_params=True, ep_field="parallel.hsdp.expert_parallel")
    assert mesh.validate(FOUR, CLAIMED) is mesh
    assert Mesh(dp_shard=2, pp=2).data_parallel_ranks(FOUR) == 2
    assert Mesh().validate(World(nnodes=1, nproc_per_node=1)) == Mesh()


@pytest.mark.parametrize(
    "mesh, field, message",
    [
        (Mesh(cp=0), "parallel.ulysses", "mesh dimension 'cp' must be at least 1, got 0"),
        (Mesh(tp=3), "parallel.tp", "tp=3 must divide the world size 4 (1 node(s) x 4 processes)"),
        (
            Mesh(pp=2, tp=4),
            "parallel.tp",
            "tp=4 must divide the world size 4 (1 node(s) x 4 processes), 2 rank(s) left by the dimensions before it",
        ),
        (
            Mesh(cp=2, tp=2),
            "parallel.tp",
            "tensor parallelism with context parallelism (parallel.ulysses) is not supported yet",
        ),
        (Mesh(dp_replicate=2), "parallel.hsdp", "lays out 2 x 1 ranks, but there are 4 data-parallel ranks"),
        (Mesh(dp_replicate=4, ep=0), "parallel.hsdp", "lays out 4 x 1 ranks, but there are 4 data-parallel ranks"),
        (Mesh(dp_replicate=4, ep=3, ep_field="parallel.ddp_ep.degree"), "parallel.ddp_ep.degree", "3 must divide"),
        (
            Mesh(dp_replicate=2, cp=2, ep=2),
            "parallel.hsdp",
            "expert parallelism (ep=2) with context (sequence) parallel (cp=2, parallel.ulysses) is not supported",
        ),
    ],
)
def test_the_mesh_refuses_what_is_not_a_mesh_of_the_world(mesh, field, message):
    with pytest.raises(ConfigError) as err:
        mesh.validate(FOUR, CLAIMED)
    assert err.value.field == field
    assert message in str(err.value)

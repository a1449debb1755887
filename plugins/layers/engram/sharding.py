"""Engram embedding tables: one packed table per layer, replicated or row-sharded.

All ``(N-1)*K`` hash heads of a layer live in one table whose rows are the heads' tables
concatenated; head ``j`` reads row ``offset_j + id_j`` (``offset`` = running sum of the
table sizes), as in the official ``MultiHeadEmbedding``.

Sharding (the paper, arXiv 2601.07372 §2.5: "embedding tables are sharded across GPUs with
All-to-All communication"; the layouts are this module's design):

* ``replicated``: a plain parameter, left to DDP/FSDP like any other.
* ``1d``: rows are split in contiguous blocks (``torch.chunk`` sizes) over all ranks of a
  1-D mesh. A lookup deduplicates its row ids, sends each id to the rank that owns it
  (``all_to_all_single``), the owners gather their rows and send the vectors back; backward
  sends the per-unique-row gradients to the owners the same way, and each owner adds them
  (``index_add_``) into the gradient of its shard, so only touched rows get a nonzero gradient.
* ``2d``: a ``(replicate, shard)`` mesh: rows are split within each shard group (``1d``
  inside the group) and every group holds a full copy. After the in-group exchange, the
  owners of a row in the different groups all-gather their touched rows and gradients and add
  them, so all copies see the same gradient.

The gradient is divided by the number of ranks in the mesh (``grad_divide_factor``), which
matches how DDP/FSDP average the gradients of every other parameter when each rank's loss is
normalised by its own tokens (OLMo-core's train module does so).

Host syncs: one per lookup (the split sizes of both directions, read back in one copy; the
distinct rows are found without reading their count back separately), and with ``2d`` one
more in backward (every copy's count of touched rows, in one copy).

Traffic depends on the number of lookups, never on the table size; every sharded table counts
the bytes it sends to other ranks in :attr:`EngramTable.comm` (``TableCommStats``). Rows and
their gradients cross ranks in the compute dtype (``wire_dtype``: bfloat16 under bf16, half the
bytes of float32); sums are taken, and the owners accumulate, in the table's float32.

Sharded weights are ``DTensor`` parameters (``Shard(0)`` on the shard dimension,
``Replicate()`` on the replicate dimension), so distributed checkpoints see their global
shape; they must be kept out of DDP/FSDP (the Engram block and model classes in
:mod:`.block` do that) and put in their own optimizer parameter group.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard

__all__ = [
    "EngramTable",
    "TableCommStats",
    "TableSharding",
    "collect_comm_stats",
    "init_table_rows_",
    "shard_row_range",
    "table_mesh",
]

SHARD_DIM = "engram_shard"
REPLICATE_DIM = "engram_replicate"
_INIT_CHUNK_ROWS = 1 << 16
_ID_BYTES = 8


class TableSharding(StrEnum):
    """How an Engram table is stored across ranks."""

    replicated = "replicated"
    """A plain parameter on every rank (DDP/FSDP treat it like any other)."""
    one_d = "1d"
    """Rows split over all ranks of one group, exchanged with all-to-all."""
    two_d = "2d"
    """Rows split within each shard group, replicated across groups."""


@dataclass
class TableCommStats:
    """Bytes this rank sent to other ranks for one table since the last :meth:`reset`."""

    forward_bytes: int = 0
    """Forward: split sizes, row ids to their owners, row vectors back to the requesters."""
    backward_bytes: int = 0
    """Backward: row gradients to their owners, and (``2d``) the cross-group exchange."""
    lookups: int = 0
    """Row lookups (tokens x heads) served."""
    unique_rows: int = 0
    """Distinct rows among them (summed over forward calls)."""

    @property
    def total_bytes(self) -> int:
        """Forward plus backward bytes."""
        return self.forward_bytes + self.backward_bytes

    def reset(self) -> None:
        """Zero all counters (call once per step)."""
        self.forward_bytes = self.backward_bytes = self.lookups = self.unique_rows = 0


_MESHES: dict[tuple, DeviceMesh] = {}


def table_mesh(
    sharding: TableSharding | str,
    *,
    shard_degree: int | None = None,
    device_type: str | None = None,
) -> DeviceMesh:
    """The device mesh of sharded tables, created once per process and layout.

    ``1d``: all ranks, dimension ``engram_shard``. ``2d``: ``(world // shard_degree,
    shard_degree)``, dimensions ``(engram_replicate, engram_shard)``; a shard group is
    ``shard_degree`` consecutive ranks (keep it within a node). Collective: call on all ranks.
    """
    sharding = TableSharding(sharding)
    if not dist.is_initialized():
        raise RuntimeError(f"Engram sharding={sharding.value} needs torch.distributed initialised")
    world = dist.get_world_size()
    device_type = device_type or ("cuda" if torch.cuda.is_available() else "cpu")
    if sharding == TableSharding.one_d:
        shape, names = (world,), (SHARD_DIM,)
    elif sharding == TableSharding.two_d:
        if shard_degree is None or shard_degree < 1 or world % shard_degree != 0:
            raise ValueError(
                f"Engram sharding=2d needs shard_degree dividing the world size {world}, "
                f"got shard_degree={shard_degree}"
            )
        shape, names = (world // shard_degree, shard_degree), (REPLICATE_DIM, SHARD_DIM)  # type: ignore[assignment]
    else:
        raise ValueError("replicated tables have no mesh")
    key = (device_type, shape, world)
    if key not in _MESHES:
        _MESHES[key] = init_device_mesh(device_type, shape, mesh_dim_names=names)
    return _MESHES[key]


def shard_row_range(num_rows: int, num_shards: int, shard_idx: int) -> tuple[int, int]:
    """Rows ``[start, end)`` of shard ``shard_idx``: ``torch.chunk`` sizes, like DTensor."""
    block = math.ceil(num_rows / num_shards)
    start = min(num_rows, shard_idx * block)
    return start, min(num_rows, start + block)


@torch.no_grad()
def init_table_rows_(local: torch.Tensor, *, row_start: int, num_rows: int, std: float, seed: int) -> None:
    """Fill ``local`` (rows ``row_start..`` of a ``num_rows``-row table) with N(0, std^2).

    Rows are drawn in fixed chunks of 65,536 rows, each chunk whole and from a generator
    seeded with ``(seed, chunk)`` (a shorter draw would not be a prefix of a longer one), so
    a row has the same value whatever the number of shards (on a given device type).
    """
    if local.device.type == "meta" or local.numel() == 0:
        return
    num_local, dim = local.shape
    row_end = row_start + num_local
    for chunk in range(row_start // _INIT_CHUNK_ROWS, (row_end - 1) // _INIT_CHUNK_ROWS + 1):
        c0 = chunk * _INIT_CHUNK_ROWS
        lo, hi = max(row_start, c0), min(row_end, c0 + _INIT_CHUNK_ROWS)
        gen = torch.Generator(device=local.device).manual_seed(seed * 1_000_003 + chunk)
        chunk_rows = min(_INIT_CHUNK_ROWS, num_rows - c0)
        values = torch.randn(chunk_rows, dim, generator=gen, device=local.device, dtype=torch.float32)
        local[lo - row_start : hi - row_start].copy_(values[lo - c0 : hi - c0].mul_(std))


class _Exchange:
    """Groups and bookkeeping shared by the forward and backward of one sharded table."""

    def __init__(self, mesh: DeviceMesh, num_rows: int, grad_divide_factor: float):
        self.shard_group = mesh.get_group(SHARD_DIM)
        self.shard_size = mesh.size(mesh.mesh_dim_names.index(SHARD_DIM))
        self.shard_rank = mesh.get_local_rank(SHARD_DIM)
        names = mesh.mesh_dim_names or ()
        self.replicate_group = mesh.get_group(REPLICATE_DIM) if REPLICATE_DIM in names else None
        self.replicate_size = mesh.size(names.index(REPLICATE_DIM)) if self.replicate_group else 1
        self.replicate_rank = mesh.get_local_rank(REPLICATE_DIM) if self.replicate_group else 0
        self.block = math.ceil(num_rows / self.shard_size)
        self.row_start, _ = shard_row_range(num_rows, self.shard_size, self.shard_rank)
        self.grad_divide_factor = grad_divide_factor
        self.stats = TableCommStats()


def _all_to_all(inp: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
    # gloo's all_to_all_single needs contiguous input and output.
    out = inp.new_empty((sum(out_splits), *inp.shape[1:]))
    dist.all_to_all_single(out, inp.contiguous(), out_splits, in_splits, group=group)
    return out


class _Distinct:
    """The sorted distinct values of a 1-D tensor and each element's index among them, as
    ``torch.unique(x, return_inverse=True)`` gives them, without a host sync: their number
    stays on the device (``first.sum()``) until the caller reads it along with the split sizes
    it reads anyway; :meth:`values` then builds them (``torch.unique`` reads that number back
    itself: one more sync per call)."""

    def __init__(self, x: torch.Tensor):
        self.sorted, order = torch.sort(x)
        #: Marks the first of each run of equal values in ``sorted``.
        self.first = torch.ones_like(self.sorted, dtype=torch.bool)
        self.first[1:] = self.sorted[1:] != self.sorted[:-1]
        self.slot = torch.cumsum(self.first, 0) - 1  # the distinct value each sorted element is
        #: For each element of ``x``, the index of its value among the distinct values.
        self.inverse = torch.empty_like(self.slot).scatter_(0, order, self.slot)

    def values(self, count: int) -> torch.Tensor:
        """The ``count`` distinct values, ascending."""
        return self.sorted.new_empty(count).scatter_(0, self.slot, self.sorted)


class _ShardedLookup(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, local_weight: torch.Tensor, rows: torch.Tensor, ex: _Exchange, wire_dtype: torch.dtype
    ) -> torch.Tensor:
        distinct = _Distinct(rows)
        inverse = distinct.inverse
        owners = torch.div(distinct.sorted, ex.block, rounding_mode="floor")
        # Distinct rows per owner (bincount would read its largest id back to the host).
        send_counts = torch.zeros(ex.shard_size, dtype=torch.long, device=rows.device)
        send_counts.scatter_add_(0, owners, distinct.first.long())
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=ex.shard_group)
        send, recv = torch.stack([send_counts, recv_counts]).tolist()  # the lookup's one host sync
        uniq = distinct.values(sum(send))
        local_rows = _all_to_all(uniq, recv, send, ex.shard_group) - ex.row_start
        # Rows travel in the compute dtype (what the projections read them in) and come back
        # in the table's dtype, so what follows is unchanged.
        vectors = _all_to_all(local_weight[local_rows].to(wire_dtype), send, recv, ex.shard_group)

        me, dim = ex.shard_rank, local_weight.shape[1]
        elem = vectors.element_size()
        ex.stats.forward_bytes += _ID_BYTES * ((ex.shard_size - 1) + sum(send) - send[me]) + elem * dim * (
            sum(recv) - recv[me]
        )
        ex.stats.lookups += rows.numel()
        ex.stats.unique_rows += uniq.numel()

        ctx.ex, ctx.send, ctx.recv, ctx.wire_dtype = ex, send, recv, wire_dtype
        ctx.local_shape, ctx.local_dtype = local_weight.shape, local_weight.dtype
        ctx.save_for_backward(inverse, local_rows)
        return vectors[inverse].to(local_weight.dtype)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        inverse, local_rows = ctx.saved_tensors
        ex: _Exchange = ctx.ex
        dim = grad_out.shape[-1]
        # Sums in the table's dtype; only the wire is in the compute dtype.
        grad_unique = grad_out.new_zeros(sum(ctx.send), dim, dtype=ctx.local_dtype)
        grad_unique.index_add_(0, inverse, grad_out.to(ctx.local_dtype))
        grad_owned = _all_to_all(grad_unique.to(ctx.wire_dtype), ctx.recv, ctx.send, ex.shard_group)
        elem = grad_owned.element_size()
        ex.stats.backward_bytes += elem * dim * (sum(ctx.send) - ctx.send[ex.shard_rank])

        grad_local = grad_out.new_zeros(ctx.local_shape, dtype=ctx.local_dtype)
        if ex.replicate_group is None or ex.replicate_size == 1:
            grad_local.index_add_(0, local_rows, grad_owned.to(ctx.local_dtype))
        else:
            distinct = _Distinct(local_rows)
            # Every copy's count of touched rows, in one host sync.
            counts = torch.cat(_all_gather(distinct.first.sum().view(1), ex)).tolist()
            touched = distinct.values(counts[ex.replicate_rank])
            grad_touched = grad_local.new_zeros(touched.numel(), dim)
            grad_touched.index_add_(0, distinct.inverse, grad_owned.to(ctx.local_dtype))
            pad = max(counts)
            # all_gather needs equal shapes: pad with row 0 / zero gradients, sliced off below.
            rows_padded = touched.new_zeros(pad)
            rows_padded[: touched.numel()] = touched
            grads_padded = grad_owned.new_zeros(pad, dim)
            grads_padded[: touched.numel()] = grad_touched
            for n, rows_r, grads_r in zip(
                counts, _all_gather(rows_padded, ex), _all_gather(grads_padded, ex), strict=True
            ):
                grad_local.index_add_(0, rows_r[:n], grads_r[:n].to(ctx.local_dtype))
            ex.stats.backward_bytes += (ex.replicate_size - 1) * (_ID_BYTES + pad * (_ID_BYTES + elem * dim))
        if ex.grad_divide_factor != 1:
            grad_local.div_(ex.grad_divide_factor)
        return grad_local, None, None, None


def _all_gather(t: torch.Tensor, ex: _Exchange) -> list[torch.Tensor]:
    out = [torch.empty_like(t) for _ in range(ex.replicate_size)]
    dist.all_gather(out, t.contiguous(), group=ex.replicate_group)
    return out


class EngramTable(nn.Module):
    """The packed embedding table of one Engram layer.

    ``forward(hash_ids[..., H]) -> [..., H, dim]``: head ``j`` reads row
    ``offsets[j] + hash_ids[..., j]``. Its parameter is ``weight`` (``[sum(table_sizes), dim]``,
    a ``DTensor`` when sharded); inside a model its name ends in ``.engram.table.weight``.

    :param table_sizes: Row count of each head's table (the hasher's primes).
    :param dim: Row width (``n_embed_per_ngram // n_head_per_ngram``).
    :param sharding: ``replicated``, ``1d`` or ``2d`` (see :class:`TableSharding`).
    :param shard_degree: For ``2d``: ranks per shard group.
    :param mesh: Use this mesh instead of :func:`table_mesh` (needs a dimension
        ``engram_shard`` and, for ``2d``, ``engram_replicate``).
    :param init_std: Standard deviation of the N(0, std^2) initialisation (the official demo
        uses ``nn.Embedding``'s default, 1.0).
    :param init_seed: Seed of the initialisation (see :func:`init_table_rows_`).
    :param grad_divide_factor: Divide sharded gradients by this; default: ranks in the mesh.
    :param init_device: Device of the parameter (``meta`` defers allocation).
    """

    def __init__(
        self,
        *,
        table_sizes: Sequence[int],
        dim: int,
        sharding: TableSharding | str = TableSharding.replicated,
        shard_degree: int | None = None,
        mesh: DeviceMesh | None = None,
        init_std: float = 1.0,
        init_seed: int = 0,
        grad_divide_factor: float | None = None,
        init_device: str | torch.device = "cpu",
    ):
        super().__init__()
        self.table_sizes = [int(s) for s in table_sizes]
        self.num_rows = sum(self.table_sizes)
        self.dim = int(dim)
        self.sharding = TableSharding(sharding)
        self.init_std = float(init_std)
        self.init_seed = int(init_seed)
        offsets = [0]
        for size in self.table_sizes[:-1]:
            offsets.append(offsets[-1] + size)
        self._offsets = torch.tensor(offsets, dtype=torch.long)
        self._device_offsets: dict[torch.device, torch.Tensor] = {}
        self._exchange: _Exchange | None = None

        if self.sharding == TableSharding.replicated:
            self.weight = nn.Parameter(torch.empty(self.num_rows, self.dim, device=init_device))
        else:
            mesh = mesh or table_mesh(self.sharding, shard_degree=shard_degree)
            expected = (SHARD_DIM,) if self.sharding == TableSharding.one_d else (REPLICATE_DIM, SHARD_DIM)
            if tuple(mesh.mesh_dim_names or ()) != expected:
                raise ValueError(
                    f"sharding={self.sharding.value} needs a mesh with dimensions {expected}, got {mesh.mesh_dim_names}"
                )
            divide = float(mesh.size()) if grad_divide_factor is None else grad_divide_factor
            self._exchange = _Exchange(mesh, self.num_rows, divide)
            start, end = shard_row_range(self.num_rows, self._exchange.shard_size, self._exchange.shard_rank)
            placements = [Shard(0)] if mesh.ndim == 1 else [Replicate(), Shard(0)]
            local = torch.empty(end - start, self.dim, device=init_device)
            self.weight = nn.Parameter(
                DTensor.from_local(
                    local,
                    mesh,
                    placements,
                    run_check=False,
                    shape=torch.Size((self.num_rows, self.dim)),
                    stride=(self.dim, 1),
                )
            )
        self.reset_parameters()

    @property
    def is_sharded(self) -> bool:
        """Whether the rows are split over ranks (``1d``/``2d``)."""
        return self._exchange is not None

    @property
    def comm(self) -> TableCommStats:
        """Bytes sent by this rank (zeros for a replicated table)."""
        return self._exchange.stats if self._exchange is not None else TableCommStats()

    @property
    def local_row_range(self) -> tuple[int, int]:
        """Global rows ``[start, end)`` stored on this rank."""
        if self._exchange is None:
            return 0, self.num_rows
        ex = self._exchange
        return shard_row_range(self.num_rows, ex.shard_size, ex.shard_rank)

    def local_weight(self) -> torch.Tensor:
        """The rows stored on this rank (a view; differentiable)."""
        w = self.weight
        return w.to_local() if isinstance(w, DTensor) else w

    def reset_parameters(self) -> None:
        """Initialise this rank's rows (called by OLMo-core after ``to_empty``), and place the
        heads' row offsets on the rows' device, so that a compiled forward finds them there
        (filled lazily inside the graph, they change its guards: one more compile per block)."""
        device = self.local_weight().device
        if device.type != "meta":
            self._device_offsets = {device: self._offsets.to(device)}
        init_table_rows_(
            self.local_weight().data,
            row_start=self.local_row_range[0],
            num_rows=self.num_rows,
            std=self.init_std,
            seed=self.init_seed,
        )

    def rows(self, hash_ids: torch.Tensor) -> torch.Tensor:
        """Global row of every hash id: ``hash_ids + offsets`` (last dimension = heads)."""
        device = hash_ids.device
        if device not in self._device_offsets:
            self._device_offsets[device] = self._offsets.to(device)
        return hash_ids + self._device_offsets[device]

    def forward(self, hash_ids: torch.Tensor, *, wire_dtype: torch.dtype | None = None) -> torch.Tensor:
        """Look up ``hash_ids[..., H]`` and return ``[..., H, dim]`` in the table's dtype.

        ``wire_dtype``: dtype the rows and their gradients cross ranks in (sharded tables; the
        Engram module passes its compute dtype, bfloat16 under bf16); None: the table's. The
        owners still add the gradients into a gradient of the table's dtype."""
        rows = self.rows(hash_ids)
        if self._exchange is None:
            return F.embedding(rows, self.weight)
        local = self.local_weight()
        flat = _ShardedLookup.apply(local, rows.reshape(-1), self._exchange, wire_dtype or local.dtype)
        return flat.view(*rows.shape, self.dim)

    def extra_repr(self) -> str:
        return f"rows={self.num_rows}, dim={self.dim}, heads={len(self.table_sizes)}, sharding={self.sharding.value}"


def collect_comm_stats(module: nn.Module, *, reset: bool = True) -> TableCommStats:
    """Sum of :attr:`EngramTable.comm` over every table in ``module`` (this rank's bytes).

    Call once per optimizer step for a "bytes moved per step" metric; ``reset`` zeroes the
    tables' counters afterwards.
    """
    total = TableCommStats()
    for table in module.modules():
        if isinstance(table, EngramTable) and table._exchange is not None:
            stats = table._exchange.stats
            total.forward_bytes += stats.forward_bytes
            total.backward_bytes += stats.backward_bytes
            total.lookups += stats.lookups
            total.unique_rows += stats.unique_rows
            if reset:
                stats.reset()
    return total

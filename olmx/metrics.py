"""The run's metric names: one vocabulary for ``metrics.jsonl`` and every tracker (a leaf: the
standard library only).

The trainer hands its callbacks OLMo-core's names (``train/CE loss``, ``optim/LR (group 0)``,
``throughput/device/MFU``, ...). :func:`canonical` names a step's metrics the run's way, and
the worker's ``metrics.jsonl`` and the first-party trackers (TensorBoard, W&B, MLflow) all record
what it returns, so a number has one name wherever it is read:

* the quantities olmx reports itself have short names (:data:`RENAMED`): ``loss``, ``lr``,
  ``flops_per_s_per_device``, ``mfu``, ``eval/loss`` (the held-out loss over the positions that
  have a target), ``eval/perplexity``; olmx's own measurements are recorded under their names
  directly (``tokens``, ``tokens_per_s``, ``tokens_per_s_per_process``, ``peak_mem_mib``,
  ``reserved_mem_mib``);
* every other metric keeps OLMo-core's name (``train/Z loss``, ``optim/total grad norm``,
  ``throughput/device/TPS``, ``eval/downstream/copa (accuracy)``, ...).

``metrics.jsonl`` adds ``step``, ``time`` (wall clock) and ``skipped`` (a non-finite step), which
trackers keep in their own way. One substitution, where a tracker refuses a name: MLflow takes
letters, digits, ``_ - . /`` and spaces only (and ``:`` except on Windows), so :func:`mlflow_name`
writes ``_`` for every other character (``eval/downstream/copa (accuracy)`` is ``eval/downstream/copa _accuracy_`` in
MLflow). TensorBoard and W&B take every name as it is.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from numbers import Real

#: The public names: what plugins may import from here (see olmx.api.PUBLIC_MODULES).
__all__ = [
    "LOSS",
    "LR",
    "EVAL_LOSS",
    "EVAL_PERPLEXITY",
    "FLOPS_PER_S",
    "MFU",
    "TOKENS",
    "TOKENS_PER_S",
    "TOKENS_PER_S_PER_PROCESS",
    "PEAK_MEMORY",
    "RESERVED_MEMORY",
    "STEP_TIME",
    "COMPUTE_MEDIAN",
    "COMPUTE_MAX",
    "WAIT_MEDIAN",
    "SLOWEST_RANK",
    "NONFINITE_STEP",
    "DOWNSTREAM_PREFIX",
    "HELDOUT_EVALUATOR",
    "HELDOUT_LABEL",
    "RENAMED",
    "canonical",
    "mlflow_name",
]

#: Training loss (mean cross entropy over the positions with a target).
LOSS = "loss"
#: Learning rate of the first parameter group.
LR = "lr"
#: Held-out loss (mean cross entropy over the positions with a target).
EVAL_LOSS = "eval/loss"
#: ``exp(eval/loss)``.
EVAL_PERPLEXITY = "eval/perplexity"
#: Model FLOP/s per device (OLMo-core's FLOPs-per-token count).
FLOPS_PER_S = "flops_per_s_per_device"
#: Model FLOP/s utilisation (OLMo-core's, against olmx's device peak).
MFU = "mfu"
#: Tokens trained on up to the step.
TOKENS = "tokens"
#: Tokens per second of the whole run, over the worker's window of recent steps.
TOKENS_PER_S = "tokens_per_s"
#: :data:`TOKENS_PER_S` over the number of processes.
TOKENS_PER_S_PER_PROCESS = "tokens_per_s_per_process"
#: Peak memory of a process in MiB, the largest over the processes: on CUDA the allocator's
#: peak (``torch.cuda.max_memory_allocated``: live tensors), on CPU the process's resident-set
#: high-water mark (everything the process holds: the interpreter, torch, OLMo-core, freed
#: blocks the heap kept).
PEAK_MEMORY = "peak_mem_mib"
#: Peak memory the CUDA caching allocator reserved, MiB (CUDA only).
RESERVED_MEMORY = "reserved_mem_mib"
#: Per-rank timing of the steps since the last collection (:mod:`olmx.worker.stragglers`, CPUs):
#: the median over the ranks of a step's wall time, seconds ...
STEP_TIME = "step_s"
#: ... the median and the largest over the ranks of a rank's own compute in a step ...
COMPUTE_MEDIAN = "compute_s_median"
COMPUTE_MAX = "compute_s_max"
#: ... the median over the ranks of the rest of the step: waiting in collectives ...
WAIT_MEDIAN = "wait_s_median"
#: ... and the rank with the most compute.
SLOWEST_RANK = "slowest_rank"
#: 1.0 on a step the step guard skipped for a non-finite loss or gradient norm.
NONFINITE_STEP = "olmx/non-finite step"
#: OLMo-core's prefix of the downstream tasks' metrics (``eval/downstream/<task> (<metric>)``).
DOWNSTREAM_PREFIX = "eval/downstream/"
#: The name of olmx's held-out loss evaluator and the label of its data, in OLMo-core's metric
#: names (``eval/<evaluator>/<label>/CE loss``).
HELDOUT_EVALUATOR = "lm"
HELDOUT_LABEL = "heldout"

#: OLMo-core's name -> the run's name, for the quantities olmx reports itself.
RENAMED: dict[str, str] = {
    "train/CE loss": LOSS,
    "optim/LR (group 0)": LR,
    "throughput/device/flopsPS": FLOPS_PER_S,
    "throughput/device/MFU": MFU,
    f"eval/{HELDOUT_EVALUATOR}/{HELDOUT_LABEL}/CE loss": EVAL_LOSS,
    f"eval/{HELDOUT_EVALUATOR}/{HELDOUT_LABEL}/PPL": EVAL_PERPLEXITY,
}

#: Characters MLflow accepts in metric and parameter names on every system (its own rule:
#: ``\w``, ``/ . -`` and spaces; a colon too, except on Windows, so not here).
_MLFLOW_REFUSED = re.compile(r"[^\w./\- ]")


def canonical(metrics: Mapping[str, object]) -> dict[str, float]:
    """Every numeric metric of a step under the run's name for it (:data:`RENAMED`; the others
    as OLMo-core names them), as ``float``; booleans and non-numbers are left out."""
    return {
        RENAMED.get(name, name): float(value)  # type: ignore[arg-type]
        for name, value in metrics.items()
        if _is_number(value)
    }


def _is_number(value: object) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, Real):
        return True
    # a 0-d tensor (OLMo-core's evaluators return them): anything with .item() and float()
    return hasattr(value, "item") and getattr(value, "ndim", 1) == 0


def mlflow_name(name: str) -> str:
    """``name`` as MLflow records it: every character MLflow refuses written as ``_`` (the one
    substitution of the vocabulary)."""
    return _MLFLOW_REFUSED.sub("_", name)

"""Round trip of a Slurm job on the local cluster (scripts/slurm/up.sh): sbatch until
``wait`` sees the final state, polling every 0.1 s.

Three jobs, each ``--repeat`` times: a bare batch script (Slurm's own overhead), the olmx
template with a worker that does nothing (plus torchrun's start), and the template with the
2-process gloo all-reduce of the tests. Prints a Markdown table.

    python benchmarks/slurm_roundtrip.py [--repeat 3] [--python /path/to/python]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from olmx_plugins.infra.slurm import jobs

ALL_REDUCE = r"""
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
assert t.item() == dist.get_world_size() * (dist.get_world_size() + 1) / 2
dist.destroy_process_group()
"""


def _round_trip(script: str, run_dir: Path) -> float:
    start = time.perf_counter()
    job_id = jobs.submit(script, run_dir=run_dir)
    state, code = jobs.wait(job_id, poll=0.1, timeout=300)
    elapsed = time.perf_counter() - start
    if (state, code) != ("COMPLETED", 0):
        raise SystemExit(f"job {job_id}: {state} {code}\n{jobs.tail(jobs.log_path(job_id, run_dir), 30)}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--python", default=sys.executable)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="olmx-slurm-bench-") as tmp:
        run_dir = Path(tmp)
        cases = {
            "bare batch script (`true`)": f"#!/bin/bash\n#SBATCH --output={run_dir}/slurm-%j.out\ntrue\n",
            "template, torchrun, 2 workers running `true`": jobs.render_sbatch(
                run_dir=run_dir, command="true", nproc_per_node=2, python=args.python, cpus_per_task=2
            ),
            "template, torchrun, 2-process gloo all-reduce": jobs.render_sbatch(
                run_dir=run_dir,
                command=[args.python, "-c", ALL_REDUCE],
                nproc_per_node=2,
                python=args.python,
                cpus_per_task=2,
            ),
        }
        print(f"load average before: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} CPUs\n")
        print("| job | runs | min s | median s |\n|---|---|---|---|")
        for name, script in cases.items():
            times = [_round_trip(script, run_dir) for _ in range(args.repeat)]
            print(f"| {name} | {len(times)} | {min(times):.1f} | {statistics.median(times):.1f} |")


if __name__ == "__main__":
    main()

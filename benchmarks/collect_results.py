"""Rebuild ``benchmarks/RESULTS.md`` from the per-topic records in ``benchmarks/results/``
(each benchmark script writes its own record there): ``python benchmarks/collect_results.py``."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
HEADER = """# Benchmark results

Every entry says what was run, on what machine and how; ratios are measured side by side in one
run. This file collects the per-topic records in `benchmarks/results/` (one section each; rebuild
it with `python benchmarks/collect_results.py`). All CPU numbers come from the shared 2-core build
machine, usually under load from parallel work (load averages are recorded in each entry): treat
absolute times as inflated and the ratios as the result. No GPU was lent to this project's
sessions so far, so there are no GPU numbers; the targets for GPUs are quoted where they apply.
"""


def main() -> None:
    """Write RESULTS.md: the header, then every ``results/*.md`` in name order."""
    parts = [HEADER]
    for path in sorted((HERE / "results").glob("*.md")):
        parts.append(f"---\n\n<!-- from benchmarks/results/{path.name} -->\n{path.read_text().strip()}\n")
    (HERE / "RESULTS.md").write_text("\n".join(parts))


if __name__ == "__main__":
    main()

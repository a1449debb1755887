"""What olmx prints, written to a pipe or a file (nothing wrapped or cut) and to a terminal
(laid out to its width), and its help texts (reflowed, brackets kept)."""

from __future__ import annotations

import fcntl
import io
import json
import os
import struct
import subprocess
import termios

from olmx.console import make_console
from tests.conftest import OLMX, olmx_cli


def in_terminal(*args: str, columns: int) -> str:
    """``olmx ARGS`` run with its output on a pseudo-terminal ``columns`` wide; what it printed."""
    primary, secondary = os.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "FORCE_COLOR")}
    proc = subprocess.Popen(
        [*OLMX, *args], stdout=secondary, stderr=subprocess.PIPE, env={**env, "TERM": "dumb"}, close_fds=True
    )
    os.close(secondary)
    chunks = []
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # the other end closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(primary)
    assert proc.wait(timeout=120) == 0, proc.stderr.read() if proc.stderr else ""
    return b"".join(chunks).decode().replace("\r\n", "\n")


def test_a_console_on_a_file_neither_wraps_nor_cuts():
    from rich.table import Table

    console = make_console(file=io.StringIO())
    line = "step 40/200 (20%), loss 3.912, eval loss 3.950 (perplexity 51.94), " + "x" * 300
    console.print(line, markup=False)
    table = Table()
    table.add_column("key")
    table.add_column("value")
    table.add_row("run dir", "/" + "long/" * 100)
    console.print(table)
    printed = console.file.getvalue().splitlines()  # type: ignore[attr-defined]
    assert printed[0] == line
    assert any("/" + "long/" * 100 in row for row in printed) and len(printed) == 1 + 5


def test_piped_plan_keeps_the_run_dir_and_the_overrides_on_one_line(tmp_path):
    root = tmp_path / ("a-runs-root-whose-path-is-much-longer-than-eighty-columns-" * 3)
    proc = olmx_cli(
        "train",
        "--dry-run",
        f"trainer.runs_root={root}",
        "parallel=auto",
        "trainer.activation_checkpointing=auto",
        cwd=tmp_path,
        env={"COLUMNS": "80"},  # a pipe: COLUMNS does not narrow it
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    run_dir = next(line for line in lines if line.startswith("│ run dir"))
    assert f"{root}/" in run_dir and "…" not in proc.stdout
    auto = lines[next(i for i, line in enumerate(lines) if line.startswith("│ auto ")) + 1]
    assert "│   chosen" in auto and "parallel=[ddp] trainer.activation_checkpointing=null" in auto, auto
    order = next(line for line in lines if line.startswith("│   order"))
    assert "least recompute" in order and "largest micro-batch" in order  # a long row, one line
    assert any(line.endswith(f"{root}/{run_dir.split(str(root) + '/')[1].split()[0]}/plan.yaml") for line in lines)


def test_plugin_descriptions_whole_in_a_pipe_and_cut_to_a_terminal():
    rows = json.loads(olmx_cli("plugins", "list", "--json").stdout)
    piped = olmx_cli("plugins", "list", env={"COLUMNS": "80"}).stdout
    for r in rows:
        assert r["description"] in piped
    narrow = in_terminal("plugins", "list", columns=80).splitlines()
    assert all(len(line) <= 80 for line in narrow), narrow
    assert len([line for line in narrow if line.startswith("│")]) == len(rows)  # one line per plugin


def test_help_reflows_docstrings_and_keeps_brackets():
    wide = {"COLUMNS": "250"}
    export = olmx_cli("export", "hf", "--help", env=wide).stdout
    # the docstring breaks after "vocabulary)," and "or": the help joins its lines
    assert "(float32, the padded vocabulary), which AutoModelForCausalLM" in export
    train = olmx_cli("train", "--help", env=wide).stdout
    assert "parallel=[fsdp,ulysses]" in train

"""olmx's one writability rule and its one way to write a file whole or not at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from olmx.errors import ConfigError
from olmx.writable import atomic_file, check_writable


def test_writable_means_a_directory_and_a_file_could_be_created_there(tmp_path):
    check_writable(tmp_path / "new" / "deeper", "f")  # nearest existing parent: tmp_path
    assert list(tmp_path.iterdir()) == []  # the probe is gone
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match=r"f: '.*/file/run' cannot be created: '.*/file' is not a directory \(h\)"):
        check_writable(tmp_path / "file" / "run", "f", hint="h")
    # where root's os.access says yes but nothing can be created
    with pytest.raises(ConfigError, match="'/proc/olmx-cache' cannot be created: '/proc' is not writable"):
        check_writable(Path("/proc/olmx-cache"), "OLMX_CACHE_DIR")


def test_a_failed_write_leaves_no_half_written_file(tmp_path):
    out = tmp_path / "ids.uint16"
    with pytest.raises(OSError), atomic_file(out) as f:
        f.write(b"half")
        raise OSError(28, "No space left on device")
    assert list(tmp_path.iterdir()) == []
    with atomic_file(out) as f:
        f.write(b"whole")
    assert out.read_bytes() == b"whole" and [p.name for p in tmp_path.iterdir()] == ["ids.uint16"]


def test_the_byte_cache_is_written_whole_or_not_at_all(tmp_path):
    from olmx.data.files import tokenize_bytes

    good = tmp_path / "a.txt"
    good.write_text("abc")
    out = tmp_path / "cache" / "tokens.uint16"
    out.parent.mkdir()
    with pytest.raises(IsADirectoryError):  # the second input fails after the first was written
        tokenize_bytes([good, tmp_path / "cache"], 256, out)
    assert list(out.parent.iterdir()) == []  # no tokens.uint16.tmpPID left for ever
    assert tokenize_bytes([good], 256, out) == 4 and out.stat().st_size == 8

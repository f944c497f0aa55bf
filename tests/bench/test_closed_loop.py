"""bench/closed_loop.py's own checks (the loop itself is tested in tests/sim)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.bench_script import BENCH


@pytest.mark.parametrize("option", ["--json", "--plot"])
def test_an_output_path_that_cannot_be_written_is_refused_before_the_36_minute_run(tmp_path: Path, option: str) -> None:
    (tmp_path / "file").write_text("a file, not a folder\n")
    target = tmp_path / "file" / "out.x"
    done = subprocess.run(
        [sys.executable, str(BENCH / "closed_loop.py"), option, str(target)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert option in done.stderr and str(target) in done.stderr and "Traceback" not in done.stderr
    assert "starting" not in done.stderr  # no world was started

"""The multiprocess metrics directory of ``router serve --workers N``: a supervisor killed with
SIGKILL cannot remove its own, so the next supervisor removes those whose processes are all gone,
and never one that a live supervisor or worker still writes into."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from router.metrics_shared import PREFIX, new_dir


@pytest.fixture()
def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture()
def live_pid() -> Iterator[int]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc.pid
    proc.kill()
    proc.wait()


def left(parent: Path, name: str, *files: str) -> Path:
    """A metrics directory as a supervisor left it, with its workers' files."""
    path = parent / name
    path.mkdir()
    for file in files:
        (path / file).write_bytes(b"\0" * 8)
    return path


def test_a_dead_supervisors_directory_is_removed(tmp_path: Path, dead_pid: int) -> None:
    stale = left(tmp_path, f"{PREFIX}{dead_pid}-abc", f"counter_{dead_pid}.db")
    made = Path(new_dir(str(tmp_path)))
    assert not stale.exists()
    assert made.is_dir() and made.parent == tmp_path and made.name.startswith(f"{PREFIX}")


def test_a_live_supervisors_directory_is_kept(tmp_path: Path, live_pid: int) -> None:
    live = left(tmp_path, f"{PREFIX}{live_pid}-abc", "counter_1.db")
    new_dir(str(tmp_path))
    assert live.is_dir() and (live / "counter_1.db").exists()


def test_a_dead_supervisors_directory_is_kept_while_a_worker_of_it_lives(
        tmp_path: Path, dead_pid: int, live_pid: int) -> None:
    # a SIGKILLed supervisor's workers keep serving (router/README.md): their files are in use
    orphaned = left(tmp_path, f"{PREFIX}{dead_pid}-abc", f"counter_{dead_pid}.db", f"gauge_livesum_{live_pid}.db")
    new_dir(str(tmp_path))
    assert orphaned.is_dir()


def test_a_directory_named_with_this_processs_pid_is_a_predecessors(tmp_path: Path) -> None:
    # a container restarted on the same /tmp (an emptyDir) runs its supervisor as the same pid
    # (often 1): the directory with that pid was made by the killed one, not by this one
    stale = left(tmp_path, f"{PREFIX}{os.getpid()}-abc")
    made = Path(new_dir(str(tmp_path)))
    assert not stale.exists() and made.is_dir()


def test_directories_it_cannot_attribute_are_left_alone(tmp_path: Path) -> None:
    unknown = [left(tmp_path, f"{PREFIX}abcd1234"),  # made before the pid was in the name
               left(tmp_path, "other-thing-1")]
    new_dir(str(tmp_path))
    assert all(path.is_dir() for path in unknown)

"""The multiprocess metrics directory of ``router serve --workers N``: a supervisor killed with
SIGKILL cannot remove its own, so the next supervisor removes those that no process holds, and
never one that a live supervisor or worker still writes into, whatever pid its name holds (a
router in another PID namespace on the same /tmp has the same pids, often 1)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from router.observe.metrics_shared import PREFIX, new_dir

ROOT = Path(__file__).resolve().parents[2]
# A supervisor (new_dir) or a worker (hold) that keeps its directory until its stdin closes.
SUPERVISOR = (
    "import sys; from router.observe.metrics_shared import new_dir; "
    "print(new_dir(sys.argv[1]), flush=True); sys.stdin.read()"
)
WORKER = (
    "import sys; from router.observe.metrics_shared import hold; "
    "hold(sys.argv[1]); print('held', flush=True); sys.stdin.read()"
)


@pytest.fixture()
def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@contextmanager
def running(code: str, arg: str, prefix: tuple[str, ...] = ()) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``code`` run with ``arg`` in its own process (after ``prefix``, e.g. ``unshare``): the
    process and the first line it printed; it is stopped at exit."""
    proc = subprocess.Popen(
        [*prefix, sys.executable, "-c", code, arg], cwd=ROOT, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line, f"exited {proc.wait()}"
        yield proc, line
    finally:
        proc.kill()
        proc.wait()


def killed_supervisors_dir(parent: Path, named: int) -> Path:
    """A directory as a supervisor killed with SIGKILL left it, renamed to hold pid ``named``."""
    with running(SUPERVISOR, str(parent)) as (supervisor, made):
        supervisor.send_signal(signal.SIGKILL)
        supervisor.wait()
    return Path(made).rename(parent / f"{PREFIX}{named}-abc")


def left(parent: Path, name: str, *files: str) -> Path:
    """A directory with ``files``, as an older version left it (no lock)."""
    path = parent / name
    path.mkdir()
    for file in files:
        (path / file).write_bytes(b"\0" * 8)
    return path


def test_a_dead_supervisors_directory_is_removed(tmp_path: Path, dead_pid: int) -> None:
    stale = killed_supervisors_dir(tmp_path, dead_pid)
    made = Path(new_dir(str(tmp_path)))
    assert not stale.exists()
    assert made.is_dir() and made.parent == tmp_path and made.name.startswith(f"{PREFIX}{os.getpid()}-")


def test_a_directory_named_with_this_processs_pid_is_a_predecessors(tmp_path: Path) -> None:
    # a container restarted on the same /tmp (an emptyDir) runs its supervisor as the same pid
    # (often 1): the directory with that pid was made by the killed one, not by this one
    stale = killed_supervisors_dir(tmp_path, os.getpid())
    made = Path(new_dir(str(tmp_path)))
    assert not stale.exists() and made.is_dir()


@pytest.mark.parametrize("named", ["this process's", "a dead process's"])
def test_a_live_supervisors_directory_is_kept_whatever_pid_its_name_holds(
    tmp_path: Path, dead_pid: int, named: str
) -> None:
    # Regression: liveness was the name's pid, which in another PID namespace on the same /tmp
    # is another process's (two containerised routers are both pid 1): a live router's
    # directory was removed and its requests failed (FileNotFoundError in observe_request).
    with running(SUPERVISOR, str(tmp_path)) as (_, made):
        pid = os.getpid() if named == "this process's" else dead_pid
        live = Path(made).rename(tmp_path / f"{PREFIX}{pid}-abc")
        # its worker's file: pid dead_pid here, another process's pid in its own namespace
        (live / f"counter_{dead_pid}.db").write_bytes(b"\0" * 8)
        new_dir(str(tmp_path))
        assert live.is_dir() and (live / f"counter_{dead_pid}.db").exists()


def test_a_killed_supervisors_directory_is_kept_while_a_worker_of_it_lives(tmp_path: Path) -> None:
    # a SIGKILLed supervisor's workers keep serving (router/README.md): their files are in use
    with running(SUPERVISOR, str(tmp_path)) as (supervisor, made):
        with running(WORKER, made):
            supervisor.send_signal(signal.SIGKILL)
            supervisor.wait()
            new_dir(str(tmp_path))
            assert Path(made).is_dir()
    new_dir(str(tmp_path))  # the worker is gone too
    assert not Path(made).exists()


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux unshare")
def test_routers_in_two_pid_namespaces_on_one_tmp_keep_each_others_directory(tmp_path: Path) -> None:
    # the reviewer's repro: two supervisors, each pid 1 in its own PID namespace
    namespace = ("unshare", "--pid", "--fork", "--mount-proc")
    if subprocess.run([*namespace, "true"], capture_output=True).returncode != 0:
        pytest.skip("cannot make a PID namespace here")
    with running(SUPERVISOR, str(tmp_path), namespace) as (_, first):
        with running(SUPERVISOR, str(tmp_path), namespace) as (_, second):
            assert Path(first).name.startswith(f"{PREFIX}1-") and Path(second).name.startswith(f"{PREFIX}1-")
            assert Path(first).is_dir() and Path(second).is_dir()


def test_pids_too_large_for_kill_in_names_are_skipped(tmp_path: Path) -> None:
    # Regression: os.kill raised OverflowError on a pid >= 2**31 and the router did not start
    odd = [
        left(tmp_path, f"{PREFIX}{2**31}-abc", f"counter_{2**63}.db"),
        left(tmp_path, f"{PREFIX}{10**30}-def", "counter_1.db"),
    ]
    made = Path(new_dir(str(tmp_path)))
    assert made.is_dir() and all(path.is_dir() for path in odd)


def test_directories_without_a_lock_are_left_alone(tmp_path: Path, dead_pid: int) -> None:
    # made by an older version (maybe still running, in another PID namespace), or not a router's
    unknown = [
        left(tmp_path, f"{PREFIX}{dead_pid}-abc", f"counter_{dead_pid}.db"),
        left(tmp_path, f"{PREFIX}{os.getpid()}-def"),
        left(tmp_path, f"{PREFIX}abcd1234"),
        left(tmp_path, "other-thing-1"),
    ]
    new_dir(str(tmp_path))
    assert all(path.is_dir() for path in unknown)

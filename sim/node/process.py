"""One replica as a child process: ``python -m sim serve`` in its own process group.

The child runs in a new session (its own process group), so signals go to the group and a
terminal's Ctrl-C reaches only the node. On Linux the child also asks the kernel for SIGKILL
when the node's thread that started it dies (``PR_SET_PDEATHSIG``), so even a node killed with
SIGKILL leaves no orphan replica.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from pathlib import Path

import sim

_PR_SET_PDEATHSIG = 1
_SIM_ROOT = str(Path(sim.__file__).resolve().parents[1])


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def serve_command(host: str, port: int, model: str, profile: str, warmup_s: float, time_scale: float,
                  max_model_len: str | None) -> list[str]:
    """The ``python -m sim serve`` command line of one replica."""
    cmd = [sys.executable, "-m", "sim", "serve", "--host", host, "--port", str(port), "--model", model,
           "--profile", profile, "--warmup-s", repr(warmup_s), "--time-scale", repr(time_scale)]
    if max_model_len is not None:
        cmd += ["--max-model-len", max_model_len]
    return cmd


class ReplicaProcess:
    """A started replica. ``log``: the file its stdout and stderr go to."""

    def __init__(self, cmd: list[str], log: Path) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (_SIM_ROOT, os.environ.get("PYTHONPATH")) if p)}
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            self.popen = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          env=env, start_new_session=True, preexec_fn=_die_with_parent)
        self.log = log
        self.pid = self.popen.pid

    def exit_code(self) -> int | None:
        """The exit code once the process has exited (negative: killed by that signal), else None."""
        return self.popen.poll()

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the replica's whole process group (no-op once it is gone)."""
        if self.popen.poll() is not None:
            return
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass

    def last_line(self) -> str:
        """The last non-empty line of its log (for the node's transition log), at most 300 chars."""
        try:
            with self.log.open("rb") as f:
                f.seek(max(0, f.seek(0, 2) - 4096))
                lines = [ln for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return ""
        return lines[-1][-300:] if lines else ""

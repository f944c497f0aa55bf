"""One replica as a child process: ``python -m sim serve`` in its own process group.

The child runs in a new session (its own process group), so signals go to the group and a
terminal's Ctrl-C reaches only the node. On Linux the child also asks the kernel for SIGKILL
when the node's thread that started it dies (``PR_SET_PDEATHSIG``), so even a node killed with
SIGKILL leaves no orphan replica.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import sim

_PR_SET_PDEATHSIG = 1
_SIM_ROOT = str(Path(sim.__file__).resolve().parents[1])


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def serve_command(
    host: str, port: int, model: str, profile: str, warmup_s: float, time_scale: float, max_model_len: str | None
) -> list[str]:
    """The ``python -m sim serve`` command line of one replica."""
    cmd = [
        sys.executable,
        "-m",
        "sim",
        "serve",
        "--host",
        host,
        "--port",
        str(port),
        "--model",
        model,
        "--profile",
        profile,
        "--warmup-s",
        repr(warmup_s),
        "--time-scale",
        repr(time_scale),
    ]
    if max_model_len is not None:
        cmd += ["--max-model-len", max_model_len]
    return cmd


class ReplicaProcess:
    """A started replica. ``log``: the file its stdout and stderr go to."""

    def __init__(self, cmd: list[str], log: Path, stdin_pipe: bool = False) -> None:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(p for p in (_SIM_ROOT, os.environ.get("PYTHONPATH")) if p),
            # the warm-up counts from now, not from when the child's imports are done
            "PROMPTEDGE_SIM_WARMUP_FROM": repr(time.time()),
        }
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            self.popen = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        self.log = log
        self.pid = self.popen.pid

    def hand_over(self, settings: dict[str, Any], log: Path) -> None:
        """Give a spare (started with ``stdin_pipe``) its replica settings, one JSON line, and
        move its log to ``log``. Raises OSError when the spare is gone."""
        assert self.popen.stdin is not None
        self.popen.stdin.write((json.dumps(settings) + "\n").encode())
        self.popen.stdin.close()
        os.replace(self.log, log)
        self.log = log

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
        """The last line with words in its log (for the node's transition log), at most 300 chars."""
        try:
            with self.log.open("rb") as f:
                f.seek(max(0, f.seek(0, 2) - 4096))
                lines = [ln for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return ""
        # the last line with words in it, without the box drawing of typer's error panels
        words = [" ".join(ln.strip(" │╭╮╰╯─").split()) for ln in lines]
        words = [w for w in words if any(ch.isalnum() for ch in w)]
        return words[-1][-300:] if words else ""


def replica_settings(
    host: str, port: int, model: str, profile: str, warmup_s: float, time_scale: float, max_model_len: str | None
) -> dict[str, Any]:
    """The same replica as ``serve_command``, as settings for a spare; the warm-up counts from now."""
    settings: dict[str, Any] = {
        "host": host,
        "port": port,
        "model": model,
        "profile": profile,
        "warmup_s": warmup_s,
        "time_scale": time_scale,
        "warmup_from": time.time(),
    }
    if max_model_len is not None:
        settings["max_model_len"] = max_model_len
    return settings


class SparePool:
    """Up to ``size`` spare replica processes (``python -m sim.node.spare``), imports done.

    ``take`` hands one its settings (None when no live spare is ready: start a fresh
    ``sim serve`` then); ``fill`` starts spares up to ``size``; ``close`` stops them."""

    def __init__(self, size: int, log_dir: Path) -> None:
        self.size = size
        self.log_dir = log_dir
        self.spares: list[ReplicaProcess] = []
        self._ids = itertools.count()

    def fill(self) -> None:
        """Drop spares that died and start new ones up to ``size``."""
        self.spares = [p for p in self.spares if p.exit_code() is None]
        while len(self.spares) < self.size:
            log = self.log_dir / f"spare-{next(self._ids)}.log"
            self.spares.append(ReplicaProcess([sys.executable, "-m", "sim.node.spare"], log, stdin_pipe=True))

    def take(self, settings: dict[str, Any], log: Path) -> ReplicaProcess | None:
        """A spare now serving ``settings`` (its log moved to ``log``), or None."""
        while self.spares:
            spare = self.spares.pop(0)
            if spare.exit_code() is not None:
                continue
            try:
                spare.hand_over(settings, log)
            except OSError:
                spare.signal(signal.SIGKILL)
                continue
            return spare
        return None

    def close(self) -> None:
        """Stop the spares (they hold no Pod: SIGKILL) and reap them."""
        for spare in self.spares:
            spare.signal(signal.SIGKILL)
            spare.popen.wait()
        self.spares = []

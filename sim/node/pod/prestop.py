"""Pure reading of a container's ``lifecycle.preStop`` hook and the kubelet's termination clock.

What the stand-in node can run of a hook written for the real image:

- ``exec`` whose command is ``sleep N`` (``["sleep", "5"]``, ``["/bin/sleep", "5"]`` or a shell
  script that is exactly ``sleep N``, e.g. ``["/bin/sh", "-c", "sleep 5"]``; ``N`` in seconds
  with GNU sleep's optional ``s``/``m``/``h`` suffix) and the ``sleep: {seconds: N}`` action of
  Kubernetes 1.29+: a sleep of N simulated seconds;
- ``httpGet``: ``GET scheme://host:port/path`` with ``host`` defaulting to the Pod's IP and the
  port by number or by the container port's name;
- any other ``exec`` command (or ``tcpSocket``, or a port name that names no container port):
  ``skip``, logged and not run, since no shell here runs the image's binaries.

Timing, as the kubelet of 1.20 does it (``pkg/kubelet/kuberuntime/kuberuntime_container.go``,
``killContainer``): the hook runs only when the grace period is above 0 and is bounded by it;
SIGTERM follows the hook; SIGKILL comes when the grace period, counted from the moment the node
saw the deletion, is over, but never less than 2 seconds after SIGTERM
(``minimumGracePeriodInSeconds``).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any, Literal

MIN_GRACE_AFTER_SIGTERM_S = 2.0  # the kubelet's minimumGracePeriodInSeconds
_SLEEP = re.compile(r"(\d+(?:\.\d+)?)([smh]?)")
_SHELLS = {"sh", "bash", "/bin/sh", "/bin/bash", "/usr/bin/sh", "/usr/bin/bash"}
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True)
class PreStopHook:
    """One preStop hook as the node runs it.

    ``kind``: ``sleep`` (``sleep_s`` simulated seconds), ``http`` (``GET`` on ``scheme``,
    ``host`` (None: the Pod's IP), ``port``, ``path``) or ``skip`` (not run: ``what`` says
    which hook and why)."""

    kind: Literal["sleep", "http", "skip"]
    sleep_s: float = 0.0
    scheme: str = "http"
    host: str | None = None
    port: int = 0
    path: str = "/"
    what: str = ""

    def url(self, pod_ip: str) -> str:
        """The ``http`` hook's URL on a Pod whose IP is ``pod_ip``."""
        return f"{self.scheme}://{self.host or pod_ip}:{self.port}{self.path}"


def pre_stop_hook(container: dict[str, Any]) -> PreStopHook | None:
    """The container's (API JSON, camelCase) ``lifecycle.preStop`` hook, None when it has none.
    Never raises: a hook the node cannot run is ``kind="skip"``, as a failed hook is only
    logged by the kubelet and termination goes on."""
    hook = (container.get("lifecycle") or {}).get("preStop")
    if not hook:
        return None
    if "exec" in hook:
        command = [str(t) for t in (hook["exec"] or {}).get("command") or []]
        seconds = _sleep_seconds(command)
        if seconds is None:
            return PreStopHook("skip", what=f"exec {command!r}: the sim node runs no image's commands")
        return PreStopHook("sleep", sleep_s=seconds)
    if "sleep" in hook:
        seconds_field: Any = (hook["sleep"] or {}).get("seconds")  # the manifest's JSON: anything
        try:
            return PreStopHook("sleep", sleep_s=max(0.0, float(seconds_field)))
        except (TypeError, ValueError):
            return PreStopHook("skip", what=f"sleep {seconds_field!r}: not a number of seconds")
    if "httpGet" in hook:
        return _http_hook(container, hook["httpGet"] or {})
    return PreStopHook("skip", what=f"{sorted(hook)}: not a hook the sim node runs")


def _sleep_seconds(command: list[str]) -> float | None:
    """N for ``sleep N`` (directly or as a shell's whole ``-c`` script), else None."""
    if len(command) >= 3 and command[0] in _SHELLS and command[1] == "-c":
        try:
            command = shlex.split(command[2])
        except ValueError:
            return None
    if len(command) != 2 or command[0].rsplit("/", 1)[-1] != "sleep":
        return None
    m = _SLEEP.fullmatch(command[1])
    return float(m.group(1)) * _UNIT_S[m.group(2)] if m else None


def _http_hook(container: dict[str, Any], http: dict[str, Any]) -> PreStopHook:
    port = http.get("port")
    if isinstance(port, str) and not port.isdigit():
        named = [p.get("containerPort") for p in container.get("ports") or [] if p.get("name") == port]
        if not named:
            return PreStopHook("skip", what=f"httpGet port {port!r} names no container port")
        port = named[0]
    try:
        number = int(port)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return PreStopHook("skip", what=f"httpGet port {port!r} is not a port")
    path = str(http.get("path") or "/")
    return PreStopHook(
        "http",
        scheme=str(http.get("scheme") or "HTTP").lower(),
        host=http.get("host") or None,
        port=number,
        path=path if path.startswith("/") else "/" + path,
    )


# Least wall time a positive preStop sleep lasts (``prestop_sleep_wall_s``).
PRESTOP_FLOOR_WALL_S = 2.0


def prestop_sleep_wall_s(sleep_s: float, time_scale: float) -> float:
    """Wall seconds a preStop ``sleep`` of ``sleep_s`` simulated seconds lasts at ``time_scale``:
    ``sleep_s / time_scale``, but at least ``min(sleep_s, PRESTOP_FLOOR_WALL_S)``; 0 for no sleep.

    The control plane runs at wall speed: an EndpointSlice update reaches the router about a
    wall second after the deletion whatever the time scale, so a sleep compressed below that
    (10 s at 15x is 0.67 s) let replicas stop while still routed to (2 x 502 in the loop's e2e
    test, 3 December)."""
    if sleep_s <= 0:
        return 0.0
    return max(sleep_s / time_scale, min(sleep_s, PRESTOP_FLOOR_WALL_S))


def sigkill_at(deleted_at: float, grace_s: float, sigterm_at: float, time_scale: float) -> float:
    """When SIGKILL is due, on the same clock as ``deleted_at`` and ``sigterm_at`` (wall
    seconds): the grace period (simulated seconds) counted from the deletion, but at least
    MIN_GRACE_AFTER_SIGTERM_S simulated seconds after SIGTERM."""
    return max(deleted_at + grace_s / time_scale, sigterm_at + MIN_GRACE_AFTER_SIGTERM_S / time_scale)

"""What the node knows about one Pod it runs: its spec, process, readiness and status."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from sim.node.pod.probe import Readiness
from sim.node.pod.spec import ReplicaSpec
from sim.node.process import ReplicaProcess
from sim.node.status import PodView, Terminated


@dataclass
class PodRuntime:
    """One Pod on this node. Times named ``*_at`` without a suffix are ``time.monotonic()``
    wall seconds; ``*_ts`` are RFC 3339 strings written to the API."""

    uid: str
    namespace: str
    name: str
    spec: ReplicaSpec | None  # None: the Pod could not be mapped (see ``error``)
    ip: str | None
    warmup_s: float
    start_ts: str
    error: str | None = None
    process: ReplicaProcess | None = None
    running_since_ts: str | None = None
    run_started_at: float = 0.0
    start_at: float = 0.0  # when the (re)start may happen (back-off)
    restart_count: int = 0
    crashes: int = 0  # consecutive short runs, for the back-off
    waiting_reason: str = "ContainerCreating"
    last_terminated: Terminated | None = None
    readiness: Readiness = field(default_factory=Readiness)
    ready_changed_ts: str = ""
    next_probe_at: float = 0.0
    probe_future: Future[bool] | None = None
    terminating: bool = False
    deleted_at: float = 0.0  # when the node saw the deletion
    grace_s: float = 0.0  # the grace period then (simulated seconds)
    hook_until: float = 0.0  # when the preStop hook is over at the latest (SIGTERM follows)
    hook_cut: bool = False  # the hook would have run past the grace period
    hook_future: Future[str] | None = None  # a preStop httpGet in flight (over when done)
    sigterm_sent: bool = False
    kill_at: float = 0.0
    killed: bool = False
    deleted: bool = False
    last_sent: dict[str, Any] | None = None
    label: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def view(self) -> PodView:
        """The status inputs as they stand."""
        spec = self.spec
        return PodView(
            ip=self.ip if spec is not None else None,
            start_time=self.start_ts,
            container=spec.container if spec else "",
            image=spec.image if spec else "",
            running_since=self.running_since_ts if self.process is not None else None,
            waiting_reason=self.error and "CreateContainerConfigError" or self.waiting_reason,
            ready=self.readiness.ready,
            ready_changed_at=self.ready_changed_ts or self.start_ts,
            restart_count=self.restart_count,
            last_terminated=self.last_terminated,
        )

    def describe(self) -> str:
        """A short state label for the transition log."""
        if self.error:
            return f"Pending ({self.error})"
        if self.terminating:
            return "Terminating"
        if self.process is None:
            return self.waiting_reason
        return "Running, ready" if self.readiness.ready else "Running, not ready"

"""Settings of one closed-loop run (``python -m sim loop``)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from sim.client.replay import PlannedRequest

POLICIES = ("predictive", "reactive", "fixed_peak", "fixed_mean")

# SLO defaults from common practice: MLPerf Inference's LLM server scenario (Llama-2-70B,
# MLCommons inference rules since v4.0) requires TTFT <= 2 s and TPOT <= 200 ms at the 99th
# percentile; we apply the same bounds per request.
DEFAULT_TTFT_S = 2.0
DEFAULT_ITL_S = 0.2


class LoopHooks(Protocol):
    """What a benchmark adds to each policy's run (``LoopConfig.hooks``).

    ``before_replay``: once the stack's Redis holds the counter history and the actor has been
    started, before the replay begins. ``sim_start``: the segment's simulated start (Unix s),
    reached at wall Unix s ``replay_at`` (the simulated clock is sim_start + (wall - replay_at)
    x speedup); ``plan``: the requests about to be replayed (wall offsets from ``replay_at``).
    ``after_replay``: once the replay ended, with the stack still up; what it returns is kept
    as the policy's ``hooks`` in the report. The loop itself imports no product package; a
    hook may (it lives in bench/)."""

    def before_replay(
        self, redis_url: str, sim_start: float, replay_at: float, plan: list[PlannedRequest], policy: str
    ) -> None: ...

    def after_replay(self, redis_url: str, router_url: str, policy: str) -> dict[str, Any]: ...


def _default_kube_tools() -> Path:
    root = Path(__file__).resolve().parents[2]
    return Path(os.environ.get("PROMPTEDGE_KUBE_TOOLS", root.parent / "shared" / "tools" / "kube"))


@dataclass(frozen=True)
class LoopConfig:
    """One side-by-side run. Times are simulated seconds unless named ``wall``.

    ``trace``: a ServeGen folder or a ``timestamp,value`` CSV (NAB); ``start_hour``: segment
    start in hours from the trace start (None: the steepest ramp after ``history_days`` whose
    total rate rises at most ``max_jump`` times from one window to the next; ``max_jump`` None:
    the steepest rise of any shape, a step included);
    ``hours``: segment length; ``speedup``: simulated seconds per wall second, for every
    process; ``warmup_s``: each replica's cold start (Pod annotation
    ``promptedge.io/sim-warmup-s``); ``peak_replicas``: the segment is rescaled so its busiest
    window needs this many replicas at ``capacity_rps`` each (requests/s one replica serves
    within the SLO; None: measured with sim.replica.latency.batch on the segment's tokens); ``history_days``:
    days before the segment written as router counters for the forecaster; ``history``: how
    (``sampled`` counts or ``expected`` rates, see below); ``max_replicas``:
    the bound of both autoscalers; ``headroom``: extra capacity fraction (forecaster and HPA
    target alike); ``control_nice``: CPU niceness of the control plane and the policy's actor
    (0: same priority as the data path)."""

    trace: Path
    start_hour: float | None = None
    # A ramp a forecast of the aggregate can follow, not a step nothing announces: on m-large,
    # hour 321.3 (94 -> 228 requests/s in an hour, at most +35 % a window) instead of hour 234
    # (x3.2 in one window).
    max_jump: float | None = 1.35
    hours: float = 1.0
    speedup: float = 7.0
    warmup_s: float = 300.0
    policies: tuple[str, ...] = POLICIES
    json_path: Path | None = None
    plot_path: Path | None = None
    seed: int = 0
    tokens_trace: Path | None = None
    questions: Path | None = None
    profile: str = "l4"
    model: str = "meta-llama/Llama-3.1-8B-Instruct"
    capacity_rps: float | None = None
    peak_replicas: int = 5
    max_replicas: int = 8
    headroom: float = 0.2
    history_days: float = 7.0
    # "sampled": each history minute a count drawn with its window's mean and its clients'
    # renewal variance, as the router's counters would hold it; "expected": the window's mean
    # rate (smooth, so a band calibrated on it is too narrow for live minutes).
    history: str = "sampled"
    miss_ratio: float = 0.75
    max_generated: int = 256
    pad_context: bool = True
    ttft_slo_s: float = DEFAULT_TTFT_S
    itl_slo_s: float = DEFAULT_ITL_S
    manifest: Path = field(default_factory=lambda: Path(__file__).resolve().parents[2] / "deploy" / "vllm-pool.yaml")
    namespace: str = "llm"
    deployment: str = "vllm"
    kube_tools: Path = field(default_factory=_default_kube_tools)
    log_dir: Path = Path("out/loop")
    progress: bool = True
    # On a cluster the control plane, etcd and the autoscalers run on other machines than the
    # GPU replicas and the router; here they share two cores, and at 7x their CPU bursts (the
    # forecaster's model selection takes ~40 % of a core) are magnified into seconds of TTFT.
    # They run at this lower CPU priority (nice), so the data path is served first.
    control_nice: int = 10
    # The reactive policy runs with the forecaster beside it in advisory mode (deciding and
    # recording, never scaling): its record is returned in the reactive run's "advisory" for
    # the what-if report (bench/loop_advisory.py, issue 35).
    advise: bool = False
    # Predictive cache warming (router/caching/warming.py, cache/warming/) for every pool: None
    # (off, the product's default) or WarmingSettings fields ({}: its defaults; "enabled" is set,
    # and tick_s is 15 simulated s unless given). It needs the forecaster's published forecast
    # (the predictive policy, or reactive with advise) and prompts counted on earlier days: the
    # loop writes none (its prompt mix has no days before the segment), a hook may.
    warming: dict[str, Any] | None = None
    hooks: LoopHooks | None = None

    def __post_init__(self) -> None:
        unknown = [p for p in self.policies if p not in POLICIES]
        if unknown:
            raise ValueError(f"unknown policies {unknown}; known: {', '.join(POLICIES)}")
        if not self.policies:
            raise ValueError(f"no policy to run; give one or more of {', '.join(POLICIES)}")
        # finite first: an infinite speed-up reached the router as a NaN, a negative history as
        # an empty array, deep inside the run
        for name, value, ok, rule in (
            ("speedup", self.speedup, self.speedup > 0, "> 0"),
            ("hours", self.hours, self.hours > 0, "> 0"),
            ("warmup_s", self.warmup_s, self.warmup_s >= 0, ">= 0"),
            ("history_days", self.history_days, self.history_days >= 0, ">= 0"),
            ("miss_ratio", self.miss_ratio, 0 <= self.miss_ratio <= 1, "in [0, 1]"),
            (
                "capacity_rps",
                self.capacity_rps,
                self.capacity_rps is None or self.capacity_rps > 0,
                "> 0 (or not given: measured)",
            ),
        ):
            if value is not None and (not math.isfinite(value) or not ok):
                raise ValueError(f"{name} must be {rule} and finite, got {value:g}")
        if self.max_jump is not None and self.max_jump < 1:
            raise ValueError(f"max_jump must be >= 1 (a factor from one window to the next), got {self.max_jump}")
        if self.history not in ("sampled", "expected"):
            raise ValueError(f"history must be 'sampled' or 'expected', got {self.history!r}")
        if not 1 <= self.peak_replicas <= self.max_replicas:
            raise ValueError("need 1 <= peak_replicas <= max_replicas")

"""Shadow verification of served semantic hits: which hits are verified, and what is sent (pure).

With the per-entry error bound (``PROMPTEDGE_CACHE_ERROR_BOUND``) and
``PROMPTEDGE_CACHE_SHADOW_RATE`` > 0, a served semantic hit is, with that probability, also
sent to a replica after the client has its answer; the two answers are compared
(cache/verify/bound/label.py) and the label teaches the entry and its pool as a compared miss does.
Without it a pool learns only from the hits its bound refused: once an entry serves, nothing
tells the bound whether its served answers stay right. The calls run in router/caching/shadowing.py;
this module decides.

Outcomes (``promptedge_router_cache_shadow_verifications_total{pool,outcome}``): ``right`` /
``wrong`` (labelled), ``no_label`` (called, but the answers could not be compared or the label
not written), ``error`` (replica error, timeout, no replica: no label), ``ineligible`` (drawn,
but a sampled or several-choice request: no answer is determined, so no call is spent),
``skipped_budget`` (drawn, but ``SHADOW_MAX_INFLIGHT`` calls are already open in this worker:
skipped, never queued) and ``skipped_load`` (drawn, but the pool sheds its lowest class, P2: a
shadow call never takes a client's room). Hits not drawn are not counted.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

Outcome = Literal["right", "wrong", "no_label", "error", "ineligible", "skipped_budget", "skipped_load"]
Decision = Literal["run", "ineligible", "skipped_budget"]
# A shadow call is served as the lowest class: P2's timeouts, and skipped where P2 is shed.
PRIORITY = "P2"
# the stream fields of a client's body: the call asks for one whole answer (vLLM refuses
# ``stream_options`` without ``stream``)
_STREAM_FIELDS = ("stream", "stream_options")


def decide(rate: float, draw: float, judged: bool, inflight: int, max_inflight: int) -> Decision | None:
    """Whether one served semantic hit is shadow-verified. ``rate``: the share verified, 0..1;
    ``draw``: a uniform number in [0, 1) drawn for this hit; ``judged``: the request's answer is
    determined by it (cache/verify/bound/label.py ``judgeable``); ``inflight``: shadow calls open in
    this worker, at most ``max_inflight``. None when not drawn (uncounted), else ``run`` or the
    outcome that skips it (module doc). The pool's load is checked by the caller, after."""
    if draw >= rate:
        return None
    if not judged:
        return "ineligible"
    if inflight >= max_inflight:
        return "skipped_budget"
    return "run"


def shadow_body(body: Mapping[str, Any]) -> bytes:
    """The JSON sent to the replica for a hit on the client's request ``body``: the same request
    without its stream fields (a non-stream call: only the final answer is compared)."""
    return json.dumps({k: v for k, v in body.items() if k not in _STREAM_FIELDS}).encode()

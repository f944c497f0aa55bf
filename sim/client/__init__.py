"""What sends requests to replicas or a router (``python -m sim replay``, ``python -m sim sample``).

- ``traces``: readers for public LLM request traces (Azure CSV, Mooncake JSONL);
- ``questions``: prompt texts: a seeded mix of new questions, exact repeats and paraphrases;
- ``prefix_text``: prompt texts whose shared prefixes follow a trace's prefix blocks;
- ``replay``: the load generator that replays a trace against any OpenAI-compatible endpoint;
- ``workload``: a trace and a question pool into a replay plan, run into a report;
- ``report``: summary numbers from request outcomes, and the printed table;
- ``sample``: the synthetic sample shipped in ``sim/samples/``;
- ``traffic/``: arrivals with real peaks, rebuilt from published per-window rate statistics.
"""

from sim.client.questions import MixConfig, QuestionMix, QuestionPair, QuestionsFormatError, load_pairs
from sim.client.replay import Outcome, PlannedRequest, ReplayConfig, plan_requests, run_plan
from sim.client.report import render, summarize
from sim.client.traces import TraceFormatError, TraceRequest, read_trace
from sim.client.workload import build_plan, load_inputs, replay_report, write_json

__all__ = [
    "MixConfig",
    "Outcome",
    "PlannedRequest",
    "QuestionMix",
    "QuestionPair",
    "QuestionsFormatError",
    "ReplayConfig",
    "TraceFormatError",
    "TraceRequest",
    "build_plan",
    "load_inputs",
    "load_pairs",
    "plan_requests",
    "read_trace",
    "render",
    "replay_report",
    "run_plan",
    "summarize",
    "write_json",
]

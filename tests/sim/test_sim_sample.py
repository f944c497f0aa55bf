"""The shipped synthetic sample is exactly what ``python -m sim sample`` generates."""

from __future__ import annotations

from pathlib import Path

from sim.client.sample import QUESTIONS_FILE, TRACE_FILE, write_samples
from sim.client.traces import read_trace


def test_shipped_sample_matches_the_generator(tmp_path: Path) -> None:
    trace, questions = write_samples(tmp_path)
    assert trace.read_bytes() == TRACE_FILE.read_bytes()
    assert questions.read_bytes() == QUESTIONS_FILE.read_bytes()
    rows = read_trace(trace)
    assert len(rows) == 2128 and 59 * 60 < rows[-1].offset_s < 60 * 60

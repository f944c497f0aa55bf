"""Token counts drawn from a real trace's joint (context, generated) distribution."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sim.client.traces import read_trace


class TokenSampler:
    """Draws (context_tokens, generated_tokens) pairs, jointly, from ``pairs`` (an empirical
    distribution: each observed request equally likely). ``max_generated`` caps generated
    tokens (the sim's cost grows with streamed tokens); 0 = no cap."""

    def __init__(self, pairs: list[tuple[int, int]], max_generated: int = 0) -> None:
        if not pairs:
            raise ValueError("need at least one (context, generated) pair")
        self._pairs = np.asarray(pairs, dtype=np.int64)
        if max_generated > 0:
            self._pairs[:, 1] = np.minimum(self._pairs[:, 1], max_generated)
        self._pairs[:, 1] = np.maximum(self._pairs[:, 1], 1)

    @classmethod
    def from_trace(cls, path: Path | str, max_generated: int = 0) -> TokenSampler:
        """From an Azure CSV or Mooncake JSONL trace (sim.client.traces.read_trace; raises
        TraceFormatError)."""
        return cls([(r.context_tokens, r.generated_tokens) for r in read_trace(path)], max_generated)

    def draw(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` x 2 int array of (context, generated) tokens."""
        return self._pairs[rng.integers(0, len(self._pairs), n)]

    def mean(self) -> tuple[float, float]:
        """Mean (context, generated) tokens per request."""
        m = self._pairs.mean(axis=0)
        return float(m[0]), float(m[1])

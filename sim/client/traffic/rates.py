"""Readers of per-window rate traces: ServeGen per-client CSV folders and NAB-style series.

ServeGen (alibaba/ServeGen ``data/language/<model>/chunk-N-trace.csv``, see
../shared/data/README.md): one headerless CSV per client, rows
``timestamp,rate,cv,pattern,arg1,arg2``: window start (s from trace start, 600 s windows),
requests/s of that client in the window, coefficient of variation of its inter-arrival times,
fitted inter-arrival distribution (``Gamma``, ``Weibull``; empty when idle) and its two fitted
parameters (not used here: the generator matches rate and CV by the method of moments).

NAB (``timestamp,value`` with a header, e.g. ``nyc_taxi.csv``, 30-minute counts): one series,
read as one Poisson client (CV 1) whose rate is value / window length.

A bad row raises :class:`TrafficFormatError` naming file, line and column.
"""

from __future__ import annotations

import csv
import math
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TextIO

SERVEGEN_WINDOW_S = 600.0


class TrafficFormatError(ValueError):
    """A rate trace that cannot be read; the message names file, line (1-based) and column."""


@dataclass(frozen=True)
class ClientWindow:
    """One client's traffic in one window: ``rate`` requests/s (>= 0), ``cv`` of its
    inter-arrival times (>= 0; 1 = Poisson), ``pattern`` the fitted distribution family
    (``"Gamma"``, ``"Weibull"``, ``"Exponential"``; ``""`` when idle)."""

    rate: float
    cv: float
    pattern: str


@dataclass
class RateSeries:
    """Per-window traffic: ``windows[i]`` holds the active clients of the window starting at
    ``i * step_s`` seconds from the trace start; ``name`` says where it came from."""

    step_s: float
    windows: list[list[ClientWindow]] = field(default_factory=list)
    name: str = ""

    def totals(self) -> list[float]:
        """Total requests/s per window (sum over clients)."""
        return [sum(c.rate for c in w) for w in self.windows]

    @property
    def span_s(self) -> float:
        return self.step_s * len(self.windows)


def _number(path: Path, line: int, column: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise TrafficFormatError(f"{path}:{line}: column {column}: expected a number, got {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise TrafficFormatError(f"{path}:{line}: column {column}: expected a finite number >= 0, got {raw!r}")
    return value


@contextmanager
def _text(path: Path) -> Iterator[TextIO]:
    """``path`` open as UTF-8 CSV text; a file that is not text raises TrafficFormatError naming
    it (and the byte), not the codec's bare message."""
    with path.open(newline="", encoding="utf-8") as f:
        try:
            yield f
        except UnicodeDecodeError as exc:
            raise TrafficFormatError(
                f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason}); expected a CSV of rates"
            ) from None


def _chunk_number(path: Path) -> int:
    found = re.search(r"(\d+)", path.stem)
    return int(found.group(1)) if found else -1


def read_servegen(folder: Path | str) -> RateSeries:
    """Sum of a ServeGen folder's clients, window by window (clients kept apart, so each
    keeps its own CV and pattern). Raises TrafficFormatError (also for a folder without CSVs)."""
    folder = Path(folder)
    files = sorted(folder.glob("*.csv"), key=_chunk_number)
    if not files:
        raise TrafficFormatError(f"{folder}: no ServeGen *.csv files")
    by_window: dict[int, list[ClientWindow]] = {}
    for path in files:
        with _text(path) as f:
            for line, row in enumerate(csv.reader(f), start=1):
                if not row:
                    continue
                if len(row) != 6:
                    raise TrafficFormatError(
                        f"{path}:{line}: expected 6 columns (timestamp,rate,cv,pattern,arg1,arg2), got {len(row)}"
                    )
                start = _number(path, line, "1 (timestamp)", row[0])
                rate = _number(path, line, "2 (rate)", row[1])
                cv = _number(path, line, "3 (cv)", row[2])
                if rate > 0:
                    by_window.setdefault(int(start // SERVEGEN_WINDOW_S), []).append(
                        ClientWindow(rate, cv, row[3].strip() or "Exponential")
                    )
                else:
                    by_window.setdefault(int(start // SERVEGEN_WINDOW_S), [])
    count = max(by_window) + 1
    return RateSeries(SERVEGEN_WINDOW_S, [by_window.get(i, []) for i in range(count)], name=folder.name)


def read_nab(path: Path | str) -> RateSeries:
    """A ``timestamp,value`` CSV of counts per fixed interval (NAB), as one Poisson client.
    Raises TrafficFormatError on a bad row or uneven steps."""
    path = Path(path)
    stamps: list[float] = []
    values: list[float] = []
    with _text(path) as f:
        reader = csv.reader(f)
        next(reader, None)
        for row in reader:
            line = reader.line_num
            if not row:
                continue
            if len(row) != 2:
                raise TrafficFormatError(f"{path}:{line}: expected 2 columns (timestamp,value), got {len(row)}")
            try:
                stamps.append(datetime.fromisoformat(row[0].strip()).timestamp())
            except ValueError:
                raise TrafficFormatError(f"{path}:{line}: column 1 (timestamp): not a date-time: {row[0]!r}") from None
            values.append(_number(path, line, "2 (value)", row[1]))
    if len(stamps) < 2:
        raise TrafficFormatError(f"{path}: fewer than 2 rows")
    step = stamps[1] - stamps[0]
    if step <= 0:
        raise TrafficFormatError(f"{path}:3: timestamps must increase")
    windows = [[ClientWindow(v / step, 1.0, "Exponential")] if v > 0 else [] for v in values]
    return RateSeries(step, windows, name=path.stem)


def data_folder_note() -> str:
    """Where the data folder is looked for, for error messages: PROMPTEDGE_DATA_DIR's value, or
    that it is unset (the default is ../shared/data next to the checkout)."""
    value = os.environ.get("PROMPTEDGE_DATA_DIR")
    if value is None:
        return "PROMPTEDGE_DATA_DIR is not set, so the data folder is ../shared/data next to the checkout"
    return f"PROMPTEDGE_DATA_DIR is {value}"


def read_rates(path: Path | str) -> RateSeries:
    """A ServeGen folder or a NAB-style CSV file, by what ``path`` is."""
    path = Path(path)
    if path.is_dir():
        return read_servegen(path)
    if path.suffix == ".csv" and path.exists():
        return read_nab(path)
    if not path.exists():
        raise TrafficFormatError(
            f"{path}: does not exist (a ServeGen folder or a timestamp,value CSV; {data_folder_note()})"
        )
    raise TrafficFormatError(f"{path}: expected a ServeGen folder or a timestamp,value CSV")

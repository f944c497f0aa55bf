"""Trace file readers: Azure LLM CSV, Mooncake JSONL, ServeGen per-client CSV folders, BurstGPT
CSV and generic ``timestamp,value`` CSV, all resampled to a fixed step.

Formats (facts from each publisher's repository):
- Azure LLM inference trace 2023 (Azure/AzurePublicDataset): header
  ``TIMESTAMP,ContextTokens,GeneratedTokens``, one row per request, naive timestamps.
- Mooncake FAST'25 (kvcache-ai/Mooncake): JSON lines with ``timestamp`` (ms since trace start),
  ``input_length``, ``output_length``.
- ServeGen (alibaba/ServeGen ``data/language/*``): one headerless CSV per client,
  ``timestamp`` (s since trace start), ``rate`` (requests/s in the window), cv, pattern, arg1,
  arg2. Total rate = sum of ``rate`` over clients per window.
- BurstGPT (HPMLL/BurstGPT): header ``Timestamp,Model,Request tokens,Response tokens,
  Total tokens,Log Type``, ``Timestamp`` in s since trace start, one row per request.
- Generic: header ``timestamp,value``; timestamp ISO-8601 (local time of ``tz`` when naive) or
  Unix s; value is a rate in the unit of the capacity per replica.

Traces with relative times start at Unix 0. A bad row raises TraceFormatError naming the file,
line and column.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from forecaster.errors import TraceFormatError
from forecaster.series import Traffic, bucket_events, resample_levels


def read_trace(path: Path, step: float | None = None, tz: str = "UTC", fmt: str = "auto") -> Traffic:
    """Read a trace file or ServeGen folder into Traffic at ``step`` s.

    step: bucket length in s; default 60 for per-request traces and the file's own interval for
    rate traces (ServeGen windows, timestamp,value rows).
    fmt: "auto" (by extension and header), "azure", "mooncake", "servegen", "burstgpt",
    "generic". tz: time zone of naive timestamps (generic and Azure). Raises TraceFormatError on
    a bad row or an unknown format, FileNotFoundError-derived TraceFormatError on a missing path.
    """
    path = Path(path)
    if not path.exists():
        raise TraceFormatError(path, 0, "-", "no such file or folder")
    kind = _detect(path) if fmt == "auto" else fmt
    readers = {
        "azure": _azure,
        "mooncake": _mooncake,
        "servegen": _servegen,
        "burstgpt": _burstgpt,
        "generic": _generic,
    }
    if kind not in readers:
        raise TraceFormatError(path, 1, "-", f"unknown trace format {kind!r}")
    traffic = readers[kind](path, step, tz)
    return Traffic(**{**traffic.__dict__, "name": path.name})


def _detect(path: Path) -> str:
    if path.is_dir():
        return "servegen"
    if path.suffix == ".jsonl":
        return "mooncake"
    with path.open(encoding="utf-8", errors="replace") as fh:
        header = fh.readline().strip().lower()
    if header.startswith("timestamp,contexttokens"):
        return "azure"
    if header.startswith("timestamp,model"):
        return "burstgpt"
    if header.startswith("timestamp,value"):
        return "generic"
    raise TraceFormatError(path, 1, "header", f"unrecognised header {header[:60]!r}")


def _read_csv(path: Path, **kwargs: object) -> pd.DataFrame:
    """pandas.read_csv after checking that every row has as many fields as the first one
    (pandas would silently turn an extra field into an index). Raises TraceFormatError for a
    ragged row, an empty file or a header without data rows."""
    with path.open(encoding="utf-8", errors="replace", newline="") as fh:
        width = None
        for line_no, row in enumerate(csv.reader(fh), start=1):
            if not row:
                continue
            width = len(row) if width is None else width
            if len(row) != width:
                raise TraceFormatError(path, line_no, "-", f"expected {width} fields, got {len(row)}")
    try:
        frame = pd.read_csv(path, index_col=False, **kwargs)  # type: ignore[call-overload]
    except pd.errors.EmptyDataError:
        raise TraceFormatError(path, 1, "-", "file is empty") from None
    if frame.empty:  # a header and nothing else: every reader needs at least one row
        raise TraceFormatError(path, 2, "-", "no data rows after the header")
    return frame


# Largest count or token number one trace row may carry: far above any real bucket (a trillion),
# far below where the planners' arithmetic overflows (1e308 did, in the KEDA-like policy).
MAX_VALUE = 1e12


def _numeric(path: Path, frame: pd.DataFrame, column: str, first_line: int) -> np.ndarray:
    """Column as float; the first unparsable, negative, infinite or larger than ``MAX_VALUE``
    cell raises with its line."""
    raw = frame[column]
    values = pd.to_numeric(raw, errors="coerce")
    bad = values.isna() | (values < 0) | ~(values <= MAX_VALUE)
    if bad.any():
        pos = int(np.argmax(bad.to_numpy()))
        raise TraceFormatError(
            path, pos + first_line, str(column), f"expected a number from 0 to {MAX_VALUE:g}, got {raw.iloc[pos]!r}"
        )
    return values.to_numpy(dtype=float)


def _timestamps(path: Path, raw: pd.Series, column: str, first_line: int, tz: str) -> np.ndarray:
    """Timestamps to Unix s. Naive times are local to ``tz``: on a daylight-saving fall-back the
    repeated hour is read as the first (summer) occurrence and the spring-forward gap is
    skipped, so the UTC grid stays strictly ordered and the lost hour shows up as missing."""
    numeric = pd.to_numeric(raw, errors="coerce")
    if numeric.notna().all():
        return numeric.to_numpy(dtype=float)
    parsed = pd.to_datetime(raw, errors="coerce", format="mixed")
    if parsed.isna().any():
        pos = int(np.argmax(parsed.isna().to_numpy()))
        raise TraceFormatError(path, pos + first_line, column, f"expected a timestamp, got {raw.iloc[pos]!r}")
    if parsed.dt.tz is None:
        first_seen = ~parsed.duplicated(keep="first")
        parsed = parsed.dt.tz_localize(tz, ambiguous=first_seen.to_numpy(), nonexistent="shift_forward")
    utc = parsed.dt.tz_convert("UTC").dt.tz_localize(None)
    return (utc - pd.Timestamp(0)).dt.total_seconds().to_numpy()


def _azure(path: Path, step: float | None, tz: str) -> Traffic:
    frame = _read_csv(path, dtype=str, keep_default_na=False)
    for col in ("TIMESTAMP", "ContextTokens", "GeneratedTokens"):
        if col not in frame.columns:
            raise TraceFormatError(path, 1, col, "missing column in header")
    times = _timestamps(path, frame["TIMESTAMP"], "TIMESTAMP", 2, tz)
    tokens = _numeric(path, frame, "ContextTokens", 2) + _numeric(path, frame, "GeneratedTokens", 2)
    step = step or 60.0
    start, rates = bucket_events(times, {"tokens": tokens}, step)
    return Traffic(start, step, rates["requests"], tokens=rates["tokens"])


def _mooncake(path: Path, step: float | None, tz: str) -> Traffic:
    times: list[float] = []
    tokens: list[float] = []
    with path.open(encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceFormatError(path, line_no, f"char {exc.colno}", "invalid JSON") from None
            for key in ("timestamp", "input_length", "output_length"):
                value = row.get(key) if isinstance(row, dict) else None
                highest = math.inf if key == "timestamp" else MAX_VALUE  # ms since 1970 pass 1e12
                if (
                    not isinstance(value, (int, float))
                    or isinstance(value, bool)
                    or not math.isfinite(value)
                    or not 0 <= value <= highest
                ):
                    raise TraceFormatError(
                        path, line_no, key, f"expected a finite number from 0 to {highest:g}, got {value!r}"
                    )
            times.append(row["timestamp"] / 1000.0)
            tokens.append(float(row["input_length"] + row["output_length"]))
    if not times:
        raise TraceFormatError(path, 1, "-", "file has no requests")
    step = step or 60.0
    start, rates = bucket_events(np.asarray(times), {"tokens": np.asarray(tokens)}, step)
    return Traffic(start, step, rates["requests"], tokens=rates["tokens"])


def _burstgpt(path: Path, step: float | None, tz: str) -> Traffic:
    frame = _read_csv(path, dtype=str, keep_default_na=False)
    for col in ("Timestamp", "Request tokens", "Response tokens"):
        if col not in frame.columns:
            raise TraceFormatError(path, 1, col, "missing column in header")
    times = _numeric(path, frame, "Timestamp", 2)
    tokens = _numeric(path, frame, "Request tokens", 2) + _numeric(path, frame, "Response tokens", 2)
    step = step or 60.0
    start, rates = bucket_events(times, {"tokens": tokens}, step)
    return Traffic(start, step, rates["requests"], tokens=rates["tokens"])


def _generic(path: Path, step: float | None, tz: str) -> Traffic:
    frame = _read_csv(path, dtype=str, keep_default_na=False)
    for col in ("timestamp", "value"):
        if col not in frame.columns:
            raise TraceFormatError(path, 1, col, "missing column in header")
    times = _timestamps(path, frame["timestamp"], "timestamp", 2, tz)
    values = _numeric(path, frame, "value", 2)
    start, grid_step, rates = resample_levels(times, values, step)
    return Traffic(start, grid_step, rates)


def _servegen(path: Path, step: float | None, tz: str) -> Traffic:
    files = sorted(path.glob("*.csv"))
    if not files:
        raise TraceFormatError(path, 0, "-", "folder has no per-client CSV files")
    parts = []
    for file in files:
        frame = _read_csv(file, header=None, usecols=[0, 1], dtype=str, keep_default_na=False)
        frame.columns = ["timestamp", "rate"]
        parts.append(
            pd.DataFrame(
                {
                    "timestamp": _numeric(file, frame, "timestamp", 1),
                    "rate": _numeric(file, frame, "rate", 1),
                }
            )
        )
    totals = pd.concat(parts).groupby("timestamp")["rate"].sum()
    start, grid_step, out = resample_levels(totals.index.to_numpy(dtype=float), totals.to_numpy(dtype=float), step)
    return Traffic(start, grid_step, out)

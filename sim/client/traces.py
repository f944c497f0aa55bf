"""Readers for public LLM request traces: arrival offsets and token counts per request.

Formats (see ../shared/data/README.md):

- Azure LLM inference trace 2023 (Azure/AzurePublicDataset ``AzureLLMInferenceTrace_*.csv``):
  header ``TIMESTAMP,ContextTokens,GeneratedTokens``; timestamps ``YYYY-MM-DD HH:MM:SS.fffffff``
  without time zone (7 fractional digits; read as naive wall-clock time).
- Mooncake FAST'25 traces (kvcache-ai/Mooncake ``*_trace.jsonl``): one JSON object per line with
  ``timestamp`` (ms since trace start), ``input_length``, ``output_length`` (tokens) and,
  when present, ``hash_ids`` (ids of the prompt's 512-token prefix blocks; equal ids = a
  shared prefix block; sim/client/prefix_text.py turns them into prompt texts).

A bad row raises :class:`TraceFormatError` naming the file, line and column.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length")


class TraceFormatError(ValueError):
    """A trace file that cannot be read. ``line`` is 1-based (0: the file as a whole);
    ``column`` is a column/field name (and position where known)."""

    def __init__(self, path: Path | str, line: int, column: str, message: str) -> None:
        self.path, self.line, self.column, self.message = str(path), line, column, message
        where = f"{path}:{line}: column {column}" if line else str(path)  # line 0: the whole file
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace: seconds since the trace's first request, token counts;
    ``hash_ids``: its prompt's prefix block ids (Mooncake), empty when the trace has none."""

    offset_s: float
    context_tokens: int
    generated_tokens: int
    hash_ids: tuple[int, ...] = ()


def read_trace(path: Path | str) -> list[TraceRequest]:
    """Read an Azure CSV (``.csv``) or Mooncake JSONL (``.jsonl``) trace, sorted by arrival.
    Raises TraceFormatError for a bad row, an unknown format or an unreadable file."""
    path = Path(path)
    readers = {".csv": read_azure_csv, ".jsonl": read_mooncake_jsonl}
    if path.suffix not in readers:
        raise TraceFormatError(path, 0, "-", "unknown trace format: expected .csv (Azure) or .jsonl (Mooncake)")
    try:
        return readers[path.suffix](path)
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceFormatError(path, 0, "-", f"cannot read the file: {exc}") from None


def _tokens(path: Path, line: int, column: str, raw: object, minimum: int) -> int:
    if isinstance(raw, bool) or not isinstance(raw, (int, str)):
        raise TraceFormatError(path, line, column, f"expected an integer token count, got {raw!r}")
    try:
        value = int(raw)
    except ValueError:
        raise TraceFormatError(path, line, column, f"expected an integer token count, got {raw!r}") from None
    if value < minimum:
        raise TraceFormatError(path, line, column, f"token count {value} is below {minimum}")
    return value


def _azure_time(path: Path, line: int, raw: str) -> float:
    head, _, frac = raw.partition(".")
    try:
        whole = datetime.strptime(head, "%Y-%m-%d %H:%M:%S")
        fraction = float("0." + frac) if frac else 0.0
        if frac and not frac.isdigit():
            raise ValueError
    except ValueError:
        raise TraceFormatError(
            path, line, "1 (TIMESTAMP)", f"expected 'YYYY-MM-DD HH:MM:SS[.fffffff]', got {raw!r}"
        ) from None
    return whole.timestamp() + fraction


def read_azure_csv(path: Path | str) -> list[TraceRequest]:
    """Azure LLM 2023 CSV -> requests sorted by arrival. Raises TraceFormatError."""
    path = Path(path)
    rows: list[tuple[float, int, int]] = []
    with path.open(newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None or tuple(h.strip() for h in header) != AZURE_COLUMNS:
            raise TraceFormatError(path, 1, "header", f"expected header {','.join(AZURE_COLUMNS)}, got {header}")
        for row in reader:
            line = reader.line_num
            if not row:
                continue
            if len(row) != 3:
                raise TraceFormatError(path, line, str(min(len(row) + 1, 4)), f"expected 3 columns, got {len(row)}")
            t = _azure_time(path, line, row[0].strip())
            context = _tokens(path, line, "2 (ContextTokens)", row[1].strip(), 0)
            generated = _tokens(path, line, "3 (GeneratedTokens)", row[2].strip(), 0)
            rows.append((t, context, generated))
    return _relative(rows)


def read_mooncake_jsonl(path: Path | str) -> list[TraceRequest]:
    """Mooncake JSONL -> requests sorted by arrival. Raises TraceFormatError."""
    path = Path(path)
    rows: list[tuple[float, int, int, tuple[int, ...]]] = []
    with path.open() as f:
        for line, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                obj = json.loads(text.rstrip("\r\n"))
            except json.JSONDecodeError as exc:
                raise TraceFormatError(path, line, str(exc.colno), f"invalid JSON: {exc.msg}") from None
            if not isinstance(obj, dict):
                raise TraceFormatError(path, line, "1", "expected a JSON object")
            for name in MOONCAKE_FIELDS:
                if name not in obj:
                    raise TraceFormatError(path, line, name, "missing field")
            ts = obj["timestamp"]
            if isinstance(ts, bool) or not isinstance(ts, (int, float)) or ts < 0:
                raise TraceFormatError(path, line, "timestamp", f"expected milliseconds >= 0, got {ts!r}")
            context = _tokens(path, line, "input_length", obj["input_length"], 0)
            generated = _tokens(path, line, "output_length", obj["output_length"], 0)
            rows.append((ts / 1000.0, context, generated, _hash_ids(path, line, obj.get("hash_ids", []))))
    return _relative(rows)


def _hash_ids(path: Path, line: int, raw: object) -> tuple[int, ...]:
    if not isinstance(raw, list) or any(isinstance(h, bool) or not isinstance(h, int) or h < 0 for h in raw):
        raise TraceFormatError(path, line, "hash_ids", "expected a list of block ids (integers >= 0)")
    return tuple(raw)


def _relative(rows: list[tuple[float, int, int]] | list[tuple[float, int, int, tuple[int, ...]]]) -> list[TraceRequest]:
    rows.sort(key=lambda r: r[0])
    if not rows:
        return []
    t0 = rows[0][0]
    return [TraceRequest(row[0] - t0, *row[1:]) for row in rows]

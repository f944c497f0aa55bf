"""Sources: every trace format on real files, bad rows named by file/line/column, Prometheus
query_range over real HTTP, missing data kept as NaN."""

from __future__ import annotations

import csv
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import numpy as np
import pytest

from forecaster import SourceUnavailable, TraceFormatError, read_trace
from forecaster.sources import PrometheusSource

TRACES = "traces"


def test_servegen_total_is_the_sum_over_clients(data_dir: Path) -> None:
    folder = data_dir / TRACES / "servegen-m-large"
    traffic = read_trace(folder)
    assert traffic.step == 600 and len(traffic) == 2016
    first_window = 0.0
    for file in folder.glob("*.csv"):
        with file.open() as fh:
            first_window += float(next(csv.reader(fh))[1])
    assert traffic.requests[0] == pytest.approx(first_window)


def test_azure_counts_every_request_in_whole_minutes(data_dir: Path) -> None:
    path = data_dir / TRACES / "azure-llm-2023/AzureLLMInferenceTrace_code.csv"
    traffic = read_trace(path)
    assert traffic.start % 60 == 0 and traffic.step == 60
    assert not np.isnan(traffic.requests).any()
    assert (traffic.requests == 0).sum() >= 10  # the trace's real silent minutes are zeros, not gaps
    assert traffic.tokens is not None and traffic.tokens.sum() > traffic.requests.sum()


def test_mooncake_and_step_override(data_dir: Path) -> None:
    path = data_dir / TRACES / "mooncake/conversation_trace.jsonl"
    minute, five = read_trace(path), read_trace(path, step=300)
    assert five.step == 300
    assert five.requests[:10].mean() == pytest.approx(minute.requests[:50].mean())


def test_generic_csv_hour_gap_stays_missing(data_dir: Path, tmp_path: Path) -> None:
    rows = (data_dir / TRACES / "nab/nyc_taxi.csv").read_text().splitlines()
    gapped = tmp_path / "gap.csv"
    gapped.write_text("\n".join(rows[:101] + rows[103:]) + "\n")  # an hour (two rows) removed
    traffic = read_trace(gapped)
    assert len(traffic) == len(rows) - 1  # the grid keeps the hour
    assert np.isnan(traffic.requests[100:102]).all()  # rows 102-103 of the file = buckets 100-101
    assert not np.isnan(traffic.requests[99]) and not np.isnan(traffic.requests[102])


def test_dst_fall_back_in_local_time_input(data_dir: Path) -> None:
    """NYC taxi is in New York local time; 2014-11-02 01:00-02:00 happened twice but the file
    has one row per half hour: in UTC the repeated hour is a gap (missing), never a collision."""
    path = data_dir / TRACES / "nab/nyc_taxi.csv"
    local = read_trace(path, tz="America/New_York")
    utc_naive = read_trace(path)
    assert len(local) == len(utc_naive) + 2
    assert np.isnan(local.requests).sum() == 2
    assert np.nansum(local.requests) == pytest.approx(utc_naive.requests.sum())
    gap = np.flatnonzero(np.isnan(local.requests))
    # 01:00 and 01:30 are read as EDT (05:00, 05:30 UTC), 02:00 as EST (07:00 UTC): the repeated
    # hour, 06:00-07:00 UTC, has no data
    assert list(local.start + gap * local.step) == [1414908000.0, 1414909800.0]


@pytest.mark.parametrize(
    ("body", "line", "column"),
    [
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6,374,44\n2023-11-16 18:15:47.1,374,-2\n",
            3,
            "GeneratedTokens",
        ),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6,374,44\nyesterday,374,44\n", 3, "TIMESTAMP"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6,374,44,9\n", 2, "-"),
        ("timestamp,value\n2014-07-01 00:00:00,10\n2014-07-01 00:30:00,\n", 3, "value"),
        # attack round 3 December: inf passed and made MAE inf and the JSON plan invalid;
        # 1e308 made the backtest's KEDA-like policy raise OverflowError
        ("timestamp,value\n2014-07-01 00:00:00,10\n2014-07-01 00:30:00,inf\n", 3, "value"),
        ("timestamp,value\n2014-07-01 00:00:00,1e308\n2014-07-01 00:30:00,10\n", 2, "value"),
    ],
    ids=["negative", "bad-time", "extra-field", "empty-value", "inf", "huge"],
)
def test_bad_csv_row_names_file_line_column(tmp_path: Path, body: str, line: int, column: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text(body)
    with pytest.raises(TraceFormatError) as err:
        read_trace(path)
    assert (err.value.path, err.value.line, err.value.column) == (path, line, column)
    assert str(path) in str(err.value) and f"line {line}" in str(err.value)


def test_bad_jsonl_line(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 5, "output_length": 5}\n'
        '{"timestamp": 10, "input_length": "x", "output_length": 5}\n'
    )
    with pytest.raises(TraceFormatError) as err:
        read_trace(path)
    assert (err.value.line, err.value.column) == (2, "input_length")


def test_servegen_bad_cell_names_the_client_file(tmp_path: Path) -> None:
    (tmp_path / "chunk-0-trace.csv").write_text("0,1.5,1,Gamma,1,1\n600,abc,1,Gamma,1,1\n")
    with pytest.raises(TraceFormatError) as err:
        read_trace(tmp_path)
    assert err.value.path.name == "chunk-0-trace.csv" and (err.value.line, err.value.column) == (2, "rate")


def test_burstgpt_format(tmp_path: Path) -> None:
    path = tmp_path / "BurstGPT_1.csv"  # header as published in HPMLL/BurstGPT
    path.write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        + "".join(f"{t},ChatGPT,100,50,150,Conversation log\n" for t in range(0, 180, 2))
    )
    traffic = read_trace(path)
    assert traffic.step == 60 and np.allclose(traffic.requests, 0.5)
    assert np.allclose(traffic.tokens, 75.0)


class _Prometheus(BaseHTTPRequestHandler):
    """query_range answering 1 req/s per sample, except samples listed in ``missing``."""

    missing: set[float] = set()
    status = 200

    def do_GET(self) -> None:  # noqa: N802 (http.server API)
        q = parse_qs(urlparse(self.path).query)
        start, end, step = float(q["start"][0]), float(q["end"][0]), float(q["step"][0])
        times = np.arange(start, end + step / 2, step)
        values = [[t, "1"] for t in times if t not in self.missing]
        body = {
            "status": "success",
            "data": {
                "resultType": "matrix",
                "result": [
                    {"metric": {"model_name": "a"}, "values": values},
                    {"metric": {"model_name": "b"}, "values": values},
                ],
            },
        }
        payload = json.dumps(body).encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def prometheus() -> Iterator[tuple[str, type[_Prometheus]]]:
    handler = type("Handler", (_Prometheus,), {"missing": set(), "status": 200})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}", handler
    server.shutdown()
    server.server_close()


def test_prometheus_sums_series_and_keeps_gaps(prometheus: tuple[str, type[_Prometheus]]) -> None:
    url, handler = prometheus
    now = 1_700_000_000.0
    source = PrometheusSource(url, "sum(rate(x[1m]))", 60.0, history_s=40 * 86400, timeout_s=2)
    end = (now // 60) * 60 - 60
    handler.missing = {end - 600.0}
    traffic = source.fetch(now)
    assert len(traffic) == 40 * 1440  # more than one query_range (11,000 points) worth
    assert traffic.requests[-1] == 2.0  # two series summed
    assert np.isnan(traffic.requests[-11]) and traffic.requests[-12] == 2.0


def test_prometheus_error_is_source_unavailable(prometheus: tuple[str, type[_Prometheus]]) -> None:
    url, handler = prometheus
    handler.status = 503
    with pytest.raises(SourceUnavailable):
        PrometheusSource(url, "up", 60.0, 3600, timeout_s=2).fetch(1_700_000_000.0)
    with pytest.raises(SourceUnavailable):  # nothing listens there
        PrometheusSource("http://127.0.0.1:9", "up", 60.0, 3600, timeout_s=1).fetch(1_700_000_000.0)


def test_prometheus_error_never_shows_the_urls_password(prometheus: tuple[str, type[_Prometheus]]) -> None:
    # Prometheus behind basic auth, its password in the URL (issue 13, finding 7): an HTTP error
    # must name the status, not echo the URL with the password.
    url, handler = prometheus
    handler.status = 401
    with pytest.raises(SourceUnavailable) as info:
        PrometheusSource(url.replace("http://", "http://promuser:pw-prom-h13@"), "up", 60.0, 3600, timeout_s=2).fetch(
            1_700_000_000.0
        )
    assert "401" in str(info.value) and "pw-prom-h13" not in str(info.value)


@pytest.mark.parametrize("value", ["Infinity", "NaN", "1e308"])
def test_a_jsonl_length_that_is_not_finite_or_absurd_names_its_line(tmp_path: Path, value: str) -> None:
    # json.loads reads Infinity and NaN; NaN < 0 is False, so both passed the check before
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 5, "output_length": 5}\n'
        f'{{"timestamp": 10, "input_length": {value}, "output_length": 5}}\n'
    )
    with pytest.raises(TraceFormatError) as err:
        read_trace(path)
    assert (err.value.line, err.value.column) == (2, "input_length")


@pytest.mark.parametrize(
    "header",
    [
        "timestamp,value",
        "TIMESTAMP,ContextTokens,GeneratedTokens",
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type",
    ],
)
def test_a_csv_with_only_its_header_is_a_format_error_not_a_traceback(tmp_path: Path, header: str) -> None:
    # found by the attack round: `forecaster backtest` printed a traceback (ValueError: no samples)
    path = tmp_path / "t.csv"
    path.write_text(header + "\n")
    with pytest.raises(TraceFormatError) as err:
        read_trace(path)
    assert (err.value.line, err.value.column) == (2, "-") and "no data rows" in str(err.value)

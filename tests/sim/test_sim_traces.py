"""Trace readers on the real public traces, and their errors on bad rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.client.traces import TraceFormatError, read_azure_csv, read_mooncake_jsonl, read_trace


@pytest.mark.parametrize(
    ("name", "count", "span_min"),
    [("AzureLLMInferenceTrace_conv.csv", 19_366, 58), ("AzureLLMInferenceTrace_code.csv", 8_819, 57)],
)
def test_azure_traces_read_completely(data_dir: Path, name: str, count: int, span_min: int) -> None:
    rows = read_trace(data_dir / "traces" / "azure-llm-2023" / name)
    assert len(rows) == count
    assert rows[0].offset_s == 0.0
    assert all(a.offset_s <= b.offset_s for a, b in zip(rows, rows[1:]))
    assert int(rows[-1].offset_s // 60) in (span_min - 1, span_min)
    # First row of the conv trace: 2023-11-16 18:15:46.6805900,374,44
    if "conv" in name:
        assert (rows[0].context_tokens, rows[0].generated_tokens) == (374, 44)
        assert rows[1].offset_s == pytest.approx(50.9951690 - 46.6805900, abs=1e-5)


def test_mooncake_trace_reads_completely(data_dir: Path) -> None:
    rows = read_trace(data_dir / "traces" / "mooncake" / "conversation_trace.jsonl")
    assert len(rows) == 12_031
    assert (rows[0].context_tokens, rows[0].generated_tokens) == (6758, 500)
    assert 58 * 60 < rows[-1].offset_s < 60 * 60


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
GOOD = "2023-11-16 18:15:46.6805900,374,44\n"


@pytest.mark.parametrize(
    ("body", "line", "column"),
    [
        (GOOD + "2023-11-16 18:15:47.1,12x,5\n", 3, "2 (ContextTokens)"),
        (GOOD + "2023-11-16 18:15:47.1,12,-5\n", 3, "3 (GeneratedTokens)"),
        (GOOD + GOOD + "16/11/2023 18:15,12,5\n", 4, "1 (TIMESTAMP)"),
        (GOOD + "2023-11-16 18:15:47.1,12\n", 3, "3"),
    ],
)
def test_azure_bad_row_names_file_line_and_column(tmp_path: Path, body: str, line: int, column: str) -> None:
    path = write(tmp_path, "bad.csv", HEADER + body)
    with pytest.raises(TraceFormatError) as info:
        read_azure_csv(path)
    assert (info.value.path, info.value.line, info.value.column) == (str(path), line, column)
    assert str(path) in str(info.value) and f":{line}:" in str(info.value)


def test_azure_wrong_header_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="header"):
        read_azure_csv(write(tmp_path, "h.csv", "time,in,out\n" + GOOD))


@pytest.mark.parametrize(
    ("text", "line", "column"),
    [
        ('{"timestamp": 0, "input_length": 5, "output_length": 2}\n{"timestamp": 1, "input_length": 5\n', 2, "35"),
        ('{"timestamp": 0, "input_length": 5}\n', 1, "output_length"),
        (
            '{"timestamp": 0, "input_length": 5, "output_length": 2}\n\n{"timestamp": "x", "input_length": 5, "output_length": 2}\n',
            3,
            "timestamp",
        ),
        ('{"timestamp": 0, "input_length": 5.5, "output_length": 2}\n', 1, "input_length"),
    ],
)
def test_mooncake_bad_row_names_file_line_and_column(tmp_path: Path, text: str, line: int, column: str) -> None:
    path = write(tmp_path, "bad.jsonl", text)
    with pytest.raises(TraceFormatError) as info:
        read_mooncake_jsonl(path)
    assert (info.value.line, info.value.column) == (line, column)


def test_unknown_or_missing_trace_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="unknown trace format"):
        read_trace(write(tmp_path, "t.txt", "x"))
    with pytest.raises(TraceFormatError, match="cannot read the file"):
        read_trace(tmp_path / "missing.csv")


def test_cli_prints_bad_row_without_traceback(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from sim.cli import app

    path = write(tmp_path, "bad.csv", HEADER + GOOD + "2023-11-16 18:15:47.1,12x,5\n")
    result = CliRunner().invoke(app, ["replay", "--target", "http://127.0.0.1:9", "--trace", str(path)])
    assert result.exit_code == 2
    assert f"{path}:3: column 2 (ContextTokens)" in result.output
    assert "Traceback" not in result.output

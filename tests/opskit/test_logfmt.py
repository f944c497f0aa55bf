"""opskit: every record one JSON line with the standard keys (request id, the reason on
errors), the router's JSON access message merged rather than nested, a text form for terminals,
and uvicorn's own loggers folded into the same handler."""

from __future__ import annotations

import io
import json
import logging
import os
from collections.abc import Iterator

import pytest

from opskit import JsonFormatter, TextFormatter, configure, hide_in_logs, masked


def record(msg: str, *args: object, exc: BaseException | None = None, **extra: object) -> logging.LogRecord:
    rec = logging.LogRecord(
        "router.server",
        logging.ERROR if exc else logging.INFO,
        __file__,
        1,
        msg,
        args,
        (type(exc), exc, exc.__traceback__) if exc else None,
    )
    rec.__dict__.update(extra)
    return rec


def test_a_json_line_has_the_standard_keys() -> None:
    line = json.loads(JsonFormatter().format(record("listening on %s", "http://h:1", request_id="r-1")))
    assert line["level"] == "INFO" and line["logger"] == "router.server"
    assert line["message"] == "listening on http://h:1" and line["request_id"] == "r-1"
    assert line["timestamp"].endswith("+00:00") and "T" in line["timestamp"]
    assert "reason" not in line


def test_a_json_line_names_the_process_that_wrote_it() -> None:
    # router serve --workers N: N processes write one stream; a merged message cannot claim another pid
    assert json.loads(JsonFormatter().format(record("hello")))["pid"] == os.getpid()
    assert json.loads(JsonFormatter().format(record('{"pid": 1, "status": 200}')))["pid"] == os.getpid()


def test_an_error_line_carries_the_reason_and_traceback() -> None:
    try:
        raise ConnectionError("redis gone")
    except ConnectionError as exc:
        line = json.loads(JsonFormatter().format(record("cache down", exc=exc)))
    assert line["reason"] == "ConnectionError: redis gone"
    assert "Traceback" in line["traceback"] and line["request_id"] is None


def test_a_json_message_is_merged_not_nested() -> None:
    access = json.dumps({"request_id": "abc", "status": 200, "level": "spoofed"})
    line = json.loads(JsonFormatter().format(record(access)))
    assert (line["request_id"], line["status"], line["message"], line["level"]) == ("abc", 200, "request", "INFO")
    assert json.loads(JsonFormatter().format(record("{not json")))["message"] == "{not json"


def test_text_is_one_readable_line() -> None:
    text = TextFormatter().format(record("listening on %s", "http://h:1", request_id="r-1"))
    assert text.endswith(" INFO router.server: listening on http://h:1 [r-1]") and "\n" not in text


@pytest.fixture()
def clean_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.parametrize("formatter", [JsonFormatter(), TextFormatter()], ids=["json", "text"])
def test_a_registered_credential_is_masked_wherever_a_library_logs_it(formatter: logging.Formatter) -> None:
    # Attack round: sentence-transformers logs the model setting it was given, so a token in a
    # model URL or query reached the router's log verbatim.
    setting = "https://user:p@ssW0RD@host.example/m?sig=SIGSECRET99&accessToken=ATSECRET99"
    hide_in_logs(setting)  # tests/conftest.py empties the registry around each test
    assert masked(setting) == "https://***@host.example/m?***"
    logged = [
        record("No modules.json found for %s, initializing", setting),
        record("Path %s not found", setting.replace("https://", "https:/")),  # as Path() writes it
        record("loading failed", exc=OSError(f"cannot open {setting}")),
    ]
    lines = [formatter.format(r) for r in logged]
    for secret in ("p@ssW0RD", "SIGSECRET99", "ATSECRET99"):
        assert not any(secret in line for line in lines), (secret, lines)
    # what is not registered is written as it was: no pattern guesses at secrets
    plain = formatter.format(
        record("max_tokens=%d request %s in hf_hub_download token=%s", 100, "sk-abcdef1234567", "t0k3n")
    )
    assert "max_tokens=100 request sk-abcdef1234567 in hf_hub_download token=t0k3n" in plain


def test_a_location_without_credentials_registers_nothing() -> None:
    text = '/models/all-MiniLM-L6-v2 sentence-transformers/all-MiniLM-L6-v2 https://host/m k {"prompt_tokens": 9}'
    for location in ("/models/all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2", "https://host/m"):
        hide_in_logs(location)
    hide_in_logs("/m?k")  # too short to mask in every line
    hide_in_logs("/m?tokens")  # a word: it would garble every access line's prompt_tokens key
    assert masked(text) == text


def test_configure_folds_uvicorns_loggers_into_one_handler(clean_root: None) -> None:
    logging.getLogger("uvicorn.error").addHandler(logging.StreamHandler(io.StringIO()))
    # as an earlier uvicorn dictConfig in the same process leaves it (seen in the full suite)
    logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
    logging.getLogger("uvicorn.error").disabled = True
    out = io.StringIO()
    configure("json", "info", stream=out)
    logging.getLogger("uvicorn.error").info("Uvicorn running on %s", "http://127.0.0.1:8000")
    logging.getLogger("router").debug("not at info")
    (line,) = [json.loads(s) for s in out.getvalue().splitlines()]
    assert line["logger"] == "uvicorn.error" and line["message"] == "Uvicorn running on http://127.0.0.1:8000"
    assert logging.getLogger("uvicorn.error").handlers == []


def test_configure_refuses_an_unknown_format(clean_root: None) -> None:
    with pytest.raises(ValueError, match="json, text"):
        configure("yaml")  # type: ignore[arg-type]

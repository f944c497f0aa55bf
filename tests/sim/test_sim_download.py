"""The trace downloader's command line (no network: --help and the URL table only)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "data" / "download.py"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_url_table_covers_every_dataset_from_official_repositories() -> None:
    done = run("--list")
    assert done.returncode == 0, done.stderr
    rows = [line.split("\t") for line in done.stdout.splitlines()]
    by_name: dict[str, list[str]] = {}
    for name, url in rows:
        by_name.setdefault(name, []).append(url)
    assert set(by_name) == {"azure-llm-2023", "mooncake", "burstgpt", "servegen-m-large"}
    assert len(by_name["servegen-m-large"]) == 162
    official = ("Azure/AzurePublicDataset/", "kvcache-ai/Mooncake/", "HPMLL/BurstGPT/", "alibaba/ServeGen/")
    assert all(url.startswith("https://") and any(repo in url for repo in official) for _, url in rows)
    assert any(url.endswith("AzureLLMInferenceTrace_conv.csv") for url in by_name["azure-llm-2023"])


def test_unknown_dataset_is_an_error_and_help_works() -> None:
    bad = run("--list", "--only", "sharegpt")
    assert bad.returncode == 2 and "unknown dataset(s) sharegpt" in bad.stderr
    assert run("--help").returncode == 0

"""Download the public LLM request traces from their official locations.

    python data/download.py --dest ../shared/data [--only azure-llm-2023 --only mooncake] [--list] [--force]

Files land in ``<dest>/traces/<dataset>/`` (the layout of ../shared/data), downloaded to a
``.part`` file first and renamed when complete; files already present are skipped unless
``--force``. Needs internet; nothing here runs in the tests beyond ``--help`` and ``--list``.

Sources (licences in each repository):
- Azure LLM inference trace 2023: github.com/Azure/AzurePublicDataset, data/ (CC-BY 4.0)
- Mooncake FAST'25 conversation trace: github.com/kvcache-ai/Mooncake, FAST25-release/traces/ (Apache-2.0)
- BurstGPT: github.com/HPMLL/BurstGPT, data/ (CC-BY 4.0; stored with Git LFS, so fetched from
  GitHub's LFS media host)
- ServeGen language m-large: github.com/alibaba/ServeGen, data/language/m-large/ (Apache-2.0)
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import httpx
import typer
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential
from tqdm import tqdm

_AZURE = "https://raw.githubusercontent.com/Azure/AzurePublicDataset/master/data"
_MOONCAKE = "https://raw.githubusercontent.com/kvcache-ai/Mooncake/main/FAST25-release/traces"
_BURSTGPT = "https://media.githubusercontent.com/media/HPMLL/BurstGPT/main/data"
_SERVEGEN = "https://raw.githubusercontent.com/alibaba/ServeGen/main/data/language/m-large"
SERVEGEN_CHUNKS = 162  # chunk-0 .. chunk-161, one file per client

SOURCES: dict[str, list[str]] = {
    "azure-llm-2023": [f"{_AZURE}/AzureLLMInferenceTrace_code.csv", f"{_AZURE}/AzureLLMInferenceTrace_conv.csv"],
    "mooncake": [f"{_MOONCAKE}/conversation_trace.jsonl"],
    "burstgpt": [f"{_BURSTGPT}/BurstGPT_1.csv", f"{_BURSTGPT}/BurstGPT_2.csv"],
    "servegen-m-large": [f"{_SERVEGEN}/chunk-{i}-trace.csv" for i in range(SERVEGEN_CHUNKS)],
}

app = typer.Typer(add_completion=False, help=__doc__.split("\n\n")[0])


@retry(
    stop=stop_after_attempt(4),
    wait=wait_exponential(multiplier=1, max=20),
    retry=retry_if_exception_type(httpx.TransportError),
    reraise=True,
)
def fetch(client: httpx.Client, url: str, target: Path) -> int:
    """Stream ``url`` into ``target`` (via ``target.part``); returns bytes written.
    Raises httpx.HTTPStatusError on a non-2xx answer; retries transport errors."""
    part = target.with_name(target.name + ".part")
    written = 0
    with client.stream("GET", url) as response:
        response.raise_for_status()
        with part.open("wb") as out:
            for block in response.iter_bytes(1 << 20):
                out.write(block)
                written += len(block)
    part.replace(target)
    return written


@app.command()
def main(
    dest: Annotated[Path, typer.Option(help="Data folder; files go to <dest>/traces/<dataset>/.")] = Path(
        "data/downloads"
    ),
    only: Annotated[list[str] | None, typer.Option(help=f"Dataset(s) to fetch: {', '.join(SOURCES)}.")] = None,
    list_only: Annotated[bool, typer.Option("--list", help="Print the URL table and exit.")] = False,
    force: Annotated[bool, typer.Option(help="Download again even if a file exists.")] = False,
) -> None:
    """Download public LLM traces (Azure 2023, Mooncake, BurstGPT, ServeGen m-large)."""
    unknown = sorted(set(only or []) - SOURCES.keys())
    if unknown:
        typer.secho(f"error: unknown dataset(s) {', '.join(unknown)}; known: {', '.join(SOURCES)}", fg="red", err=True)
        raise typer.Exit(2)
    chosen = {name: urls for name, urls in SOURCES.items() if not only or name in only}
    if list_only:
        for name, urls in chosen.items():
            for url in urls:
                typer.echo(f"{name}\t{url}")
        return
    files = [(name, url) for name, urls in chosen.items() for url in urls]
    with httpx.Client(follow_redirects=True, timeout=httpx.Timeout(60.0, connect=15.0)) as client:
        for name, url in tqdm(files, unit="file", desc="download"):
            target = dest / "traces" / name / url.rsplit("/", 1)[1]
            if target.exists() and not force:
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                fetch(client, url, target)
            except httpx.HTTPError as exc:
                typer.secho(f"error: {url}: {exc}", fg="red", err=True)
                raise typer.Exit(1) from None


if __name__ == "__main__":
    app()

"""Embedding cost per text, one text per pass (naive) against length-sorted batches, per backend;
the ceiling of what batching can gain on this CPU; int8 as an extra, not-default column.

    python bench/embed_throughput.py [--texts N] [--rounds R] [--json PATH]

Texts: GPTCache's paraphrases (``../shared/data/cache-eval/gptcache-paraphrases``, MIT), the
first N "similar" sides (lengths 10-256 tokens, median ~30). Every mode runs in each of R rounds,
interleaved, so the neighbours' load hits all of them alike; the median round is reported.
Costs are the process's CPU ms per text on one thread (what a core spends), and the GFLOP/s
that implies (2 * layers * (4 h^2 + 2 h ffn) FLOPs per real token, attention scores excluded:
<2 % at these lengths).

Why a ceiling: batched and naive both keep every core busy at saturation (the naive baseline
runs one pass per request on a thread pool), so batched/naive throughput is at most the ratio
of their CPU cost per text, that is the GFLOP/s a core reaches on a batch over what it reaches
on one short text. The uniform sweep measures that directly (B texts of L tokens, no padding).

int8: onnxruntime.quantization.quantize_dynamic of the same export. It changes the vectors (the
cosine to the fp32 vector and the shift of pair similarities are printed) and the cache's
threshold 0.96 was tuned on fp32 vectors, so it is measured here only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cache.embed.encoder import SentenceTransformerEncoder  # noqa: E402
from cache.embed.load import load_encoder  # noqa: E402
from cache.embed.onnx import OnnxEncoder, _session, default_cache_dir, model_digest  # noqa: E402

DATA = Path(os.environ.get("PROMPTEDGE_DATA_DIR", ROOT.parent / "shared" / "data"))
PAIRS = DATA / "cache-eval" / "gptcache-paraphrases" / "mock_data.json"
BATCH = 32  # texts per encode call in the batched mode (the embedder's max_batch)


def flops_per_token(config: Any) -> float:
    h, ffn, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    return 2.0 * layers * (4 * h * h + 2 * h * ffn)


def cpu_ms_per_text(encode: Callable[[list[str]], np.ndarray], texts: list[str], batch: int) -> float:
    started = time.process_time()
    for i in range(0, len(texts), batch):
        encode(texts[i : i + batch])
    return 1000 * (time.process_time() - started) / len(texts)


def uniform_sweep(encoder: OnnxEncoder, flops: float) -> list[dict[str, Any]]:
    """GFLOP/s of one thread on B texts of exactly L tokens (no padding)."""
    rows = []
    for length in (16, 32, 64):
        for size in (1, 2, 4, 8, 16, 32):
            ids = np.full((size, length), 2000, dtype=np.int64)
            feed = {
                name: (
                    ids
                    if name == "input_ids"
                    else np.ones_like(ids)
                    if name == "attention_mask"
                    else np.zeros_like(ids)
                )
                for name in encoder._input_names
            }
            encoder._session.run(None, feed)
            reps = max(3, 48 // size)
            started = time.process_time()
            for _ in range(reps):
                encoder._session.run(None, feed)
            seconds = (time.process_time() - started) / reps
            rows.append(
                {
                    "tokens": length,
                    "texts": size,
                    "cpu_ms_per_text": round(1000 * seconds / size, 2),
                    "gflop_per_s": round(size * length * flops / seconds / 1e9, 1),
                }
            )
    return rows


def main(args: argparse.Namespace) -> dict[str, Any]:
    pairs = json.loads(PAIRS.read_text())
    texts = [p["similar"] for p in pairs[: args.texts]]
    torch_encoder = load_encoder(threads=1, backend="torch")
    onnx_encoder = load_encoder(threads=1, backend="onnx")
    assert isinstance(torch_encoder, SentenceTransformerEncoder) and isinstance(onnx_encoder, OnnxEncoder)
    auto_model = torch_encoder._model[0].auto_model  # type: ignore[index]
    flops = flops_per_token(auto_model.config)
    tokens = sum(
        len(x)
        for x in onnx_encoder._tokenizer(texts, truncation=True, max_length=onnx_encoder._max_length)["input_ids"]
    )
    from onnxruntime.quantization import QuantType, quantize_dynamic

    encoders: dict[str, Callable[[list[str]], np.ndarray]] = {
        "torch": torch_encoder.encode,
        "onnx": onnx_encoder.encode,
    }
    with tempfile.TemporaryDirectory() as tmp:
        int8_path = Path(tmp) / "int8.onnx"
        quantize_dynamic(
            default_cache_dir() / f"{model_digest(auto_model)}.onnx",
            int8_path,
            weight_type=QuantType.QInt8,
            per_channel=True,
        )
        int8 = OnnxEncoder(
            _session(int8_path.read_bytes(), 1),
            onnx_encoder._tokenizer,
            onnx_encoder._input_names,
            onnx_encoder._max_length,
            onnx_encoder.dim,
        )
    encoders["onnx-int8"] = int8.encode
    for encode in encoders.values():
        encode(texts[:BATCH])  # first passes allocate
    costs: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for name, encode in encoders.items():
            for mode, batch in (("naive", 1), ("batched", BATCH)):
                costs.setdefault(f"{name}/{mode}", []).append(cpu_ms_per_text(encode, texts, batch))
        print(f"  round done, load {os.getloadavg()[0]:.1f}", file=sys.stderr)
    rows = {}
    for name in encoders:
        naive = statistics.median(costs[f"{name}/naive"])
        batched = statistics.median(costs[f"{name}/batched"])
        rows[name] = {
            "naive_cpu_ms_per_text": round(naive, 2),
            "batched_cpu_ms_per_text": round(batched, 2),
            "naive_gflop_per_s": round(tokens * flops / len(texts) / naive / 1e6, 1),
            "batched_gflop_per_s": round(tokens * flops / len(texts) / batched / 1e6, 1),
            "batching_gain": round(naive / batched, 2),
        }
    # int8 against fp32: vectors and the similarities the cache decides on
    origins = [p["origin"] for p in pairs[: args.texts]]
    fp32_a, fp32_b = onnx_encoder.encode(texts), onnx_encoder.encode(origins)
    int8_a, int8_b = int8.encode(texts), int8.encode(origins)
    shift = (int8_a * int8_b).sum(1) - (fp32_a * fp32_b).sum(1)
    flips = int((((int8_a * int8_b).sum(1) >= 0.96) != ((fp32_a * fp32_b).sum(1) >= 0.96)).sum())
    sweep = uniform_sweep(onnx_encoder, flops)
    single = next(r for r in sweep if r["tokens"] == 32 and r["texts"] == 1)
    best = max(sweep, key=lambda r: r["gflop_per_s"])
    return {
        "texts": len(texts),
        "mean_tokens": round(tokens / len(texts), 1),
        "mflop_per_token": round(flops / 1e6, 1),
        "rounds": args.rounds,
        "backends": rows,
        "uniform_sweep_onnx": sweep,
        "ceiling": {
            "single_32_token_gflop_per_s": single["gflop_per_s"],
            "best": best,
            "ratio": round(best["gflop_per_s"] / single["gflop_per_s"], 2),
        },
        "int8_vs_fp32": {
            "min_cosine": round(float((int8_a * fp32_a).sum(1).min()), 4),
            "mean_cosine": round(float((int8_a * fp32_a).sum(1).mean()), 4),
            "pair_similarity_shift_mean_abs": round(float(np.abs(shift).mean()), 4),
            "pair_similarity_shift_max_abs": round(float(np.abs(shift).max()), 4),
            "decisions_flipped_at_0_96": flips,
            "pairs": len(texts),
        },
        "cpu_count": os.cpu_count(),
        "loadavg_1m_at_end": os.getloadavg()[0],
    }


def table(report: dict[str, Any]) -> str:
    lines = [f"{'backend':10} | {'naive ms/text':>13} {'GFLOP/s':>7} | {'batched ms/text':>15} {'GFLOP/s':>7} | gain"]
    for name, r in report["backends"].items():
        lines.append(
            f"{name:10} | {r['naive_cpu_ms_per_text']:>13.2f} {r['naive_gflop_per_s']:>7.1f} | "
            f"{r['batched_cpu_ms_per_text']:>15.2f} {r['batched_gflop_per_s']:>7.1f} | {r['batching_gain']:.2f}x"
        )
    c = report["ceiling"]
    lines.append(
        f"ceiling (onnx fp32, uniform lengths): one 32-token text {c['single_32_token_gflop_per_s']} GFLOP/s, "
        f"best {c['best']['gflop_per_s']} GFLOP/s at {c['best']['texts']} x {c['best']['tokens']} tokens "
        f"-> batched/naive <= {c['ratio']}x"
    )
    q = report["int8_vs_fp32"]
    lines.append(
        f"int8 vs fp32: cosine min {q['min_cosine']} mean {q['mean_cosine']}; pair similarity shift "
        f"mean {q['pair_similarity_shift_mean_abs']} max {q['pair_similarity_shift_max_abs']}; "
        f"{q['decisions_flipped_at_0_96']} of {q['pairs']} decisions at 0.96 flip"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    arguments = parser.parse_args()
    result = main(arguments)
    print(
        f"{result['texts']} texts, {result['mean_tokens']} tokens on average, "
        f"{result['mflop_per_token']} MFLOP per token; CPU ms per text on one thread, median of "
        f"{result['rounds']} rounds"
    )
    print(table(result))
    print(f"load average (1 min) at the end: {result['loadavg_1m_at_end']:.1f} on {result['cpu_count']} CPUs")
    if arguments.json:
        arguments.json.parent.mkdir(parents=True, exist_ok=True)
        arguments.json.write_text(json.dumps(result, indent=2))

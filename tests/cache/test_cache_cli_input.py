"""``python -m cache`` commands that write a file, and the public sets they read, on bad input
(issue 34 adversarial round): one line naming what is wrong, exit 2, never a traceback.

Before: an --out that is a folder, below a file, or unwritable (/dev/full) gave a traceback and
exit 1 (train-verifier only after the whole training run); a verifier whose ``trained_on`` is not
an object raised AttributeError; a public set whose scores are NaN, infinite or out of 0..5, or
whose files are all empty, was accepted silently (a prior with no labels, or a verifier said to be
trained on sets it never saw).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cache.training.public_sets import prior_layout

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "cache", *args], capture_output=True, text=True, env=environ, timeout=300, cwd=ROOT
    )


def assert_clean_error(result: subprocess.CompletedProcess[str], *words: str) -> None:
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "╭" not in result.stderr, result.stderr[-2000:]
    assert all(word in result.stderr for word in words), result.stderr[-2000:]


def _public_dir(root: Path, sts_line: str = "4.5\ta dog runs\ta dog is running\n", sick: str | None = None) -> Path:
    for local in prior_layout():
        path = root / local
        path.parent.mkdir(parents=True, exist_ok=True)
        if local.endswith("SICK_train.txt"):
            path.write_text(
                sick
                if sick is not None
                else "pair_ID\tA\tB\trel\tent\n1\ta man sings\ta man is singing\t4.8\tENTAILMENT\n"
            )
        else:
            path.write_text(sts_line * 3)
    return root


@pytest.mark.parametrize("where", ["directory", "below_a_file", "dev_full"])
def test_fit_region_bound_unwritable_out_is_one_line(tmp_path: Path, where: str) -> None:
    if where == "directory":
        out = tmp_path / "out"
        out.mkdir()
    elif where == "below_a_file":
        (tmp_path / "file").write_text("x")
        out = tmp_path / "file" / "prior.json"
    else:
        out = Path("/dev/full")
    assert_clean_error(run_cli("fit-region-bound", "--online-only", "--out", str(out)), str(out))


def test_train_verifier_out_is_a_folder_is_one_line_before_training(tmp_path: Path) -> None:
    # enough pairs for a training run: the error must come before it
    pairs = [
        {"text_a": f"how do i cook rice {i}", "text_b": f"how to cook rice {i}", "label": i % 2} for i in range(600)
    ]
    qqp = tmp_path / "pairs.json"
    qqp.write_text(json.dumps(pairs))
    out = tmp_path / "out"
    out.mkdir()
    result = run_cli(
        "train-verifier", "--pairs", str(qqp), "--with-public", str(_public_dir(tmp_path / "pub")), "--out", str(out)
    )
    assert_clean_error(result, str(out))


def test_fit_region_bound_verifier_trained_on_not_an_object_is_one_line(tmp_path: Path) -> None:
    shipped = json.loads((ROOT / "cache/models/verifier.json").read_text())
    shipped["trained_on"] = "qqp"
    verifier = tmp_path / "verifier.json"
    verifier.write_text(json.dumps(shipped))
    result = run_cli(
        "fit-region-bound",
        "--public-dir",
        str(_public_dir(tmp_path / "pub")),
        "--out",
        str(tmp_path / "p.json"),
        env={"PROMPTEDGE_CACHE_VERIFIER_PATH": str(verifier)},
    )
    assert_clean_error(result, str(verifier))


@pytest.mark.parametrize("score", ["nan", "inf", "-1e9", "5.5"])
def test_public_set_score_not_finite_or_out_of_range_names_the_line(tmp_path: Path, score: str) -> None:
    from cache.errors import PairsFormatError
    from cache.training.public_sets import load_prior_sets

    directory = _public_dir(tmp_path, sts_line=f"{score}\ta\tb\n")
    with pytest.raises(PairsFormatError, match="line 1"):
        load_prior_sets(directory)


def test_public_sets_with_no_scored_pair_name_the_directory(tmp_path: Path) -> None:
    from cache.errors import PairsFormatError
    from cache.training.public_sets import load_prior_sets

    with pytest.raises(PairsFormatError, match="no scored pair") as caught:
        load_prior_sets(_public_dir(tmp_path, sts_line="", sick=""))
    assert str(tmp_path) in str(caught.value)


def test_sick_relatedness_out_of_range_names_the_line(tmp_path: Path) -> None:
    from cache.errors import PairsFormatError
    from cache.training.public_sets import load_prior_sets

    directory = _public_dir(tmp_path, sick="pair_ID\tA\tB\trel\tent\n1\ta\tb\tnan\tENTAILMENT\n")
    with pytest.raises(PairsFormatError, match="SICK_train.txt: line 2: relatedness"):
        load_prior_sets(directory)


def test_missing_public_files_name_the_option_that_gave_the_directory(tmp_path: Path) -> None:
    from cache.errors import PairsFormatError
    from cache.training.public_sets import load_prior_sets

    with pytest.raises(PairsFormatError, match=f"not found in --with-public {tmp_path}"):
        load_prior_sets(tmp_path, "--with-public")


@pytest.mark.parametrize(
    ("command", "option"),
    [("fit-bound", "--out"), ("train-verifier", "--out"), ("eval", "--json"), ("eval-bound", "--json")],
)
def test_other_commands_check_their_output_file_before_any_work(tmp_path: Path, command: str, option: str) -> None:
    pairs = tmp_path / "pairs.json"
    pairs.write_text(json.dumps([{"text_a": "a", "text_b": "b", "label": 1}] * 10))
    out = tmp_path / "out"
    out.mkdir()
    assert_clean_error(run_cli(command, "--pairs", str(pairs), option, str(out)), f"{option} {out}")


def test_train_embedder_out_below_a_file_is_one_line(tmp_path: Path) -> None:
    pairs = tmp_path / "pairs.json"
    pairs.write_text(json.dumps([{"text_a": "a", "text_b": "b", "label": 1}] * 10))
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / "model"
    assert_clean_error(run_cli("train-embedder", "--pairs", str(pairs), "--out", str(out)), f"--out {out}")

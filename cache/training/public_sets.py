"""Held-out public paraphrase / near-miss sets for choosing the default match stage (issue 34).

Neither set is trained or calibrated on, and neither is copied into the repository: they are
read from a directory (``PROMPTEDGE_CACHE_EVAL_PUBLIC_DIR``, else ``--public-dir``) that
``fetch_public_sets`` fills from a pinned commit of the public GitHub repository
brmson/dataset-sts (which redistributes both), or that a person filled by hand.

- **STS 2016** (SemEval-2016 Task 1 test sets with gold scores: answer-answer, headlines,
  plagiarism, postediting, question-question; CC BY-SA 3.0 for the StackExchange parts, see the
  upstream LICENSE.txt). One pair per line, ``score<TAB>text_a<TAB>text_b``; lines with no score
  were not in the official scoring and are skipped. Label: 1 when score >= 4, the STS
  annotation guidelines' "mostly equivalent, only unimportant details differ" and above; 3
  ("roughly equivalent, but some important information differs") and below are near-misses
  a cache must not serve.
- **SICK 2014** test set (``SICK_test_annotated.txt``; CC BY-NC-SA 3.0): short image-caption
  sentences rewritten by rule (negation, swapped roles, antonyms): many near-misses with high
  word overlap. Label 1 when the pair is judged ENTAILMENT with relatedness >= 4.5 (on a 1..5
  scale), else 0 (contradictions, neutral pairs, one-way entailments that lose detail).

A third group is the per-entry bound's prior source (issue 34 item 2, ``load_prior_sets``) and,
with ``python -m cache train-verifier --with-public DIR``, extra training pairs for the learned
verifier; never an evaluation set: the **STS 2012-2015** test and train files of the same repository but
MSRpar (MRPC's sentences, kept apart by the issue), labelled as STS 2016, and **SICK 2014's
train split** (``SICK_train.txt``), labelled as its test split.

Pure readers on text plus one downloader (stdlib urllib). Each reader raises PairsFormatError
naming the file and line.
"""

from __future__ import annotations

import math
import os
import urllib.request
from pathlib import Path

from cache.errors import PairsFormatError
from cache.training.eval import Pairs

ENV_DIR = "PROMPTEDGE_CACHE_EVAL_PUBLIC_DIR"
REPOSITORY = "brmson/dataset-sts"
COMMIT = "e1d3375f5b3bc24f21aa4e46f96eb379e9fc1081"
STS2016_FILES = ("answer-answer", "headlines", "plagiarism", "postediting", "question-question")
STS_SAME_MEANING = 4.0
STS_SCORE_RANGE = (0.0, 5.0)  # the STS annotation scale
SICK_FILE = "SICK_test_annotated.txt"
SICK_SAME_RELATEDNESS = 4.5
SICK_RELATEDNESS_RANGE = (1.0, 5.0)  # SICK's relatedness scale
# the region bound's prior sources (module doc): no 2016 file, no MSRpar, no SICK test
PRIOR_STS_FILES = (
    "2012/OnWN.test",
    "2012/SMTeuroparl.test",
    "2012/SMTeuroparl.train",
    "2012/SMTnews.test",
    "2013/FNWN.test",
    "2013/OnWN.test",
    "2013/headlines.test",
    "2014/OnWN.test",
    "2014/deft-forum.test",
    "2014/deft-news.test",
    "2014/headlines.test",
    "2014/images.test",
    "2014/tweet-news.test",
    "2015/answers-forums.test",
    "2015/answers-students.test",
    "2015/belief.test",
    "2015/headlines.test",
    "2015/images.test",
)
SICK_PRIOR_FILE = "SICK_train.txt"


def _remote(path: str) -> str:
    return f"https://raw.githubusercontent.com/{REPOSITORY}/{COMMIT}/{path}"


def layout() -> dict[str, tuple[str, str]]:
    """Local relative path -> (upstream path, URL) of every file the sets need."""
    files = {f"sts2016/{name}.test.tsv": f"data/sts/semeval-sts/2016/{name}.test.tsv" for name in STS2016_FILES} | {
        f"sick2014/{SICK_FILE}": f"data/sts/sick2014/{SICK_FILE}"
    }
    return {local: (upstream, _remote(upstream)) for local, upstream in files.items()}


def prior_layout() -> dict[str, tuple[str, str]]:
    """``layout`` for the bound's prior sources (module doc): local path -> (upstream, URL)."""
    files = {f"prior/sts/{name}.tsv": f"data/sts/semeval-sts/{name}.tsv" for name in PRIOR_STS_FILES} | {
        f"prior/sick2014/{SICK_PRIOR_FILE}": f"data/sts/sick2014/{SICK_PRIOR_FILE}"
    }
    return {local: (upstream, _remote(upstream)) for local, upstream in files.items()}


def public_dir(explicit: Path | None = None) -> Path | None:
    """The directory of the sets: ``explicit``, else ``$PROMPTEDGE_CACHE_EVAL_PUBLIC_DIR``, else None."""
    if explicit is not None:
        return explicit
    value = os.environ.get(ENV_DIR)
    return Path(value) if value else None


def fetch_public_sets(
    dest: Path, timeout_s: float = 30.0, files: dict[str, tuple[str, str]] | None = None
) -> list[Path]:
    """Download the files missing under ``dest`` from the pinned commit (``files``: ``layout()``
    unless given, e.g. ``prior_layout()``); returns the paths written. Raises OSError
    (urllib's errors included) when the network is not reachable."""
    written = []
    for local, (_, url) in (layout() if files is None else files).items():
        target = dest / local
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 (fixed https URL)
            data = response.read()
        tmp = target.with_suffix(target.suffix + ".part")
        tmp.write_bytes(data)
        tmp.replace(target)
        written.append(target)
    return written


# how a missing file of the sets is explained (``given_as`` names where the directory came from)
_EVAL_HINT = "python bench/cache_default_choice.py --fetch"
_PRIOR_HINT = "python -m cache fit-region-bound --public-dir DIR --fetch"


def load_sts2016(directory: Path, given_as: str = ENV_DIR) -> Pairs:
    """The scored pairs of the five STS 2016 test files under ``directory/sts2016``, labelled
    1 when the gold score is >= 4. Raises PairsFormatError (missing file, bad line or score,
    no scored pair at all); ``given_as`` (an option or ``ENV_DIR``) is named when a file is missing."""
    paths = [directory / "sts2016" / f"{name}.test.tsv" for name in STS2016_FILES]
    return _not_empty(_load_sts(paths, _missing(directory, given_as, _EVAL_HINT)), directory)


def load_prior_sets(directory: Path, given_as: str = ENV_DIR) -> Pairs:
    """The bound's prior sources under ``directory/prior`` (``prior_layout``): STS 2012-2015's
    scored pairs (labelled as ``load_sts2016``) and SICK's train pairs (as ``load_sick``).
    Raises PairsFormatError (missing file, bad line or score, no scored pair at all);
    ``given_as`` (e.g. ``--with-public``) is named when a file is missing."""
    missing = _missing(directory, given_as, _PRIOR_HINT)
    sts = _load_sts([directory / "prior" / "sts" / f"{name}.tsv" for name in PRIOR_STS_FILES], missing)
    sick = _load_sick_file(directory / "prior" / "sick2014" / SICK_PRIOR_FILE, missing)
    assert sts.labels is not None and sick.labels is not None
    return _not_empty(Pairs(sts.text_a + sick.text_a, sts.text_b + sick.text_b, sts.labels + sick.labels), directory)


def _missing(directory: Path, given_as: str, hint: str) -> str:
    """What a file-not-found error adds after the path: where the directory came from."""
    return f"not found in {given_as} {directory} (fill it with `{hint}`)"


def _not_empty(pairs: Pairs, directory: Path) -> Pairs:
    """``pairs``, or PairsFormatError naming ``directory`` when it holds no scored pair (empty
    files would give a prior or a training set without labels, silently)."""
    if not pairs.text_a:
        raise PairsFormatError(f"{directory}: the set's files hold no scored pair")
    return pairs


def _score(path: Path, number: int, name: str, text: str, bounds: tuple[float, float]) -> float:
    """``text`` as a finite number within ``bounds``; PairsFormatError naming the file and line."""
    try:
        value = float(text)
    except ValueError:
        raise PairsFormatError(f"{path}: line {number}: {name} {text!r} is not a number") from None
    if not (math.isfinite(value) and bounds[0] <= value <= bounds[1]):
        raise PairsFormatError(f"{path}: line {number}: {name} {text!r} is not within {bounds[0]:g}..{bounds[1]:g}")
    return value


def _load_sts(paths: list[Path], missing: str) -> Pairs:
    a: list[str] = []
    b: list[str] = []
    labels: list[int] = []
    for path in paths:
        for number, line in enumerate(_lines(path, missing), start=1):
            fields = line.rstrip("\n").split("\t")
            if len(fields) < 3:
                raise PairsFormatError(f"{path}: line {number}: expected score, text_a, text_b separated by tabs")
            if not fields[0].strip():
                continue  # not in the official scoring: no gold score
            score = _score(path, number, "score", fields[0], STS_SCORE_RANGE)
            a.append(fields[1])
            b.append(fields[2])
            labels.append(int(score >= STS_SAME_MEANING))
    return Pairs(a, b, labels)


def load_sick(directory: Path, given_as: str = ENV_DIR) -> Pairs:
    """The SICK 2014 test pairs under ``directory/sick2014``, labelled 1 for ENTAILMENT with
    relatedness >= 4.5. Raises PairsFormatError (missing file, bad line or relatedness, no pair)."""
    path = directory / "sick2014" / SICK_FILE
    return _not_empty(_load_sick_file(path, _missing(directory, given_as, _EVAL_HINT)), directory)


def _load_sick_file(path: Path, missing: str) -> Pairs:
    a: list[str] = []
    b: list[str] = []
    labels: list[int] = []
    for number, line in enumerate(_lines(path, missing), start=1):
        fields = line.rstrip("\n").split("\t")
        if number == 1 and fields[0] == "pair_ID":
            continue
        if len(fields) < 5:
            raise PairsFormatError(f"{path}: line {number}: expected 5 tab-separated fields, got {len(fields)}")
        relatedness = _score(path, number, "relatedness", fields[3], SICK_RELATEDNESS_RANGE)
        a.append(fields[1])
        b.append(fields[2])
        labels.append(int(fields[4].strip() == "ENTAILMENT" and relatedness >= SICK_SAME_RELATEDNESS))
    return Pairs(a, b, labels)


def _lines(path: Path, missing: str) -> list[str]:
    try:
        return path.read_text(encoding="utf-8-sig").splitlines()
    except FileNotFoundError:
        raise PairsFormatError(f"{path}: {missing}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PairsFormatError(f"{path}: cannot read: {exc}") from exc

"""Synthetic sample shipped in ``sim/samples/`` (``python -m sim sample`` regenerates it).

Both files are synthetic, generated here with a fixed seed; they are not real traffic:

- ``sample_trace.csv``: Azure LLM 2023 CSV format, 60 minutes. Per-minute rate
  ``30 + 12 sin(2 pi m / 30) + 0.2 m`` requests (a wave on a slow ramp), Poisson arrivals
  inside each minute; context tokens log-normal (median 800), generated tokens log-normal
  (median 90, 5..600).
- ``sample_questions.json``: question pairs in the QQP/GPTCache shape
  ``{"text_a", "text_b", "label"}`` built from templates: label 1 pairs ask the same thing in
  other words, label 0 pairs share words but ask something else.
"""

from __future__ import annotations

import json
import math
import random
from datetime import datetime, timedelta
from pathlib import Path

# the data sits at the package root (sim/samples/, shipped as package data), not beside this module
SAMPLES_DIR = Path(__file__).resolve().parents[1] / "samples"
TRACE_FILE = SAMPLES_DIR / "sample_trace.csv"
QUESTIONS_FILE = SAMPLES_DIR / "sample_questions.json"

TOPICS = (
    "Python",
    "Kubernetes",
    "linear algebra",
    "French",
    "the guitar",
    "machine learning",
    "chess",
    "photography",
    "Rust",
    "statistics",
    "cooking",
    "SQL",
    "public speaking",
    "Spanish",
    "calculus",
    "networking",
    "Docker",
    "investing",
    "drawing",
    "typing",
    "the piano",
    "Go",
    "swimming",
    "economics",
    "Redis",
    "painting",
    "Japanese",
    "algorithms",
    "writing",
    "physics",
    "chemistry",
    "German",
    "yoga",
    "accounting",
    "the violin",
    "JavaScript",
    "gardening",
    "astronomy",
    "poetry",
    "baking",
    "sailing",
    "Linux",
    "probability",
    "philosophy",
    "running",
    "C++",
    "history",
    "woodworking",
    "design",
    "marketing",
    "Mandarin",
    "knitting",
    "biology",
    "climbing",
    "Haskell",
    "geometry",
    "singing",
    "negotiation",
    "cycling",
    "Excel",
    "TypeScript",
    "Kotlin",
    "Swift",
    "Scala",
    "Elixir",
    "PostgreSQL",
    "Terraform",
    "Ansible",
    "Kafka",
    "GraphQL",
    "the cello",
    "the drums",
    "the flute",
    "the saxophone",
    "the ukulele",
    "Italian",
    "Portuguese",
    "Korean",
    "Arabic",
    "Russian",
    "Hindi",
    "Greek",
    "Latin",
    "Dutch",
    "Swedish",
    "tennis",
    "golf",
    "surfing",
    "skiing",
    "boxing",
    "fencing",
    "archery",
    "rowing",
    "karate",
    "meditation",
    "pottery",
    "calligraphy",
    "origami",
    "embroidery",
    "sculpture",
    "filmmaking",
    "animation",
    "game design",
    "UX research",
    "data visualization",
    "cryptography",
    "compilers",
    "operating systems",
    "topology",
    "number theory",
    "game theory",
    "genetics",
    "neuroscience",
    "geology",
    "meteorology",
    "oceanography",
    "archaeology",
    "linguistics",
    "sociology",
    "psychology",
)
# Label 1: the same question in other words. Label 0: shared words, a different question.
SAME = (
    ("How do I learn {t}?", "What is the best way to learn {t}?"),
    ("Is {t} hard to learn?", "How difficult is it to learn {t}?"),
    ("What are good books about {t}?", "Which books would you recommend on {t}?"),
    ("How long does it take to learn {t}?", "How much time do I need to get good at {t}?"),
    ("Why should I learn {t}?", "What are the benefits of learning {t}?"),
    ("What are common mistakes in {t}?", "Which mistakes do beginners often make in {t}?"),
    ("Can I learn {t} on my own?", "Is it possible to teach myself {t}?"),
    ("What are the basics of {t}?", "What fundamentals of {t} should I know first?"),
)
DIFFERENT = (
    ("How do I teach {t}?", "How do I learn {t} fast?"),
    ("Is {t} hard to teach to children?", "Is {t} popular with children?"),
    ("What are good videos about {t}?", "What are bad habits in {t}?"),
    ("How long has {t} existed?", "How long is a course on {t}?"),
    ("Why do people dislike {t}?", "Why do people start {t}?"),
    ("What jobs use {t}?", "What tools do I need for {t}?"),
    ("Who invented {t}?", "Who is the best teacher of {t}?"),
    ("Where can I practise {t}?", "Where did {t} come from?"),
)


def sample_questions(seed: int = 7) -> list[dict[str, object]]:
    """All template pairs (label 1 and 0), shuffled with ``seed``."""
    pairs: list[dict[str, object]] = []
    for topic in TOPICS:
        for label, templates in ((1, SAME), (0, DIFFERENT)):
            for a, b in templates:
                pairs.append({"text_a": a.format(t=topic), "text_b": b.format(t=topic), "label": label})
    random.Random(seed).shuffle(pairs)
    return pairs


def sample_trace_rows(seed: int = 7, minutes: int = 60) -> list[tuple[str, int, int]]:
    """(timestamp, context_tokens, generated_tokens) rows in Azure CSV conventions."""
    rng = random.Random(seed)
    start = datetime(2026, 1, 5, 9, 0, 0)
    rows = []
    for m in range(minutes):
        rate = 30 + 12 * math.sin(2 * math.pi * m / 30) + 0.2 * m
        t = 0.0
        while True:
            t += rng.expovariate(rate / 60.0)
            if t >= 60.0:
                break
            when = start + timedelta(minutes=m, seconds=t)
            context = max(2, int(rng.lognormvariate(math.log(800), 0.8)))
            generated = min(600, max(5, int(rng.lognormvariate(math.log(90), 0.7))))
            rows.append((when.strftime("%Y-%m-%d %H:%M:%S.%f") + "0", context, generated))
    return rows


def write_samples(dest: Path = SAMPLES_DIR) -> tuple[Path, Path]:
    """Write both sample files into ``dest``; returns their paths."""
    dest.mkdir(parents=True, exist_ok=True)
    trace, questions = dest / TRACE_FILE.name, dest / QUESTIONS_FILE.name
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"] + [f"{t},{c},{g}" for t, c, g in sample_trace_rows()]
    trace.write_text("\n".join(lines) + "\n")
    questions.write_text(json.dumps(sample_questions(), indent=1) + "\n")
    return trace, questions

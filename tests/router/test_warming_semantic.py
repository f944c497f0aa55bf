"""A warm generation is stored as a client's miss is: its semantic entry too (loads the
embedding model, hence slow)."""

from __future__ import annotations

import pytest

from tests.router.test_warming import KEYS, chat, key_of, seed, store, wait_for, warming  # noqa: F401  (fixtures)

pytestmark = pytest.mark.slow

QUESTION = "How do I turn on the lights in the kitchen?"
PARAPHRASE = "How can I turn on the kitchen lights?"


async def test_a_warmed_entry_answers_paraphrases_of_its_tenant(
    start_replica, start_router, client, store, warming
) -> None:
    warming()
    await seed(store, [QUESTION])
    router = await start_router([(await start_replica()).url], api_keys=KEYS)
    assert await wait_for(lambda: store.exists(key_of(chat(QUESTION))), timeout_s=30.0)
    url = router.url + "/v1/chat/completions"

    async def semantic_hit() -> bool:  # the semantic entry is written just after the exact one
        response = await client.post(
            url, json=chat(PARAPHRASE), headers={"authorization": "Bearer key-acme", "cache-control": "no-store"}
        )
        return response.headers["x-cache"] == "semantic"

    assert await wait_for(semantic_hit, timeout_s=5.0)
    other = await client.post(
        url, json=chat(PARAPHRASE), headers={"authorization": "Bearer key-beta", "cache-control": "no-store"}
    )
    assert other.headers["x-cache"] == "miss"

"""``python -m router serve --workers 4`` as real processes in front of three simulated replicas,
default policy (``predicted_ttft``): the workers share no dispatch state, yet every turn of a
conversation reaches the same replica, whichever worker takes it (its rendezvous owner,
router/dispatch/choice.py), so its prefix cache is met on every turn."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import httpx

from tests.router.router_process import MODEL, start_replica, start_router
from tests.router.test_workers import answered_by, wait_until_serving

WORKERS = 4


def test_four_workers_send_every_turn_of_a_conversation_to_one_replica(tmp_path: Path, redis_url: str) -> None:
    replicas = [start_replica(tmp_path, max_model_len=8192) for _ in range(3)]
    router = None
    try:
        router = start_router(
            tmp_path,
            env={
                "PROMPTEDGE_REDIS_URL": redis_url,
                "PROMPTEDGE_ROUTER_REPLICAS": json.dumps([{"url": url, "model": MODEL} for _, url in replicas]),
                "PROMPTEDGE_ROUTER_ANONYMOUS_CACHE": "off",  # every request is dispatched
            },
            args=("--workers", str(WORKERS)),
        )
        wait_until_serving(router, WORKERS)
        time.sleep(1.0)  # a few scrapes (every 0.25 s): before its first, a worker scores as prefix_aware
        conversations = []
        for c in range(5):
            messages = [
                {"role": "system", "content": "You are a helpful assistant. " * 40},
                {"role": "user", "content": f"conversation {c}: where do I start?"},
            ]
            turns = []
            for turn in range(3):
                request_id = uuid.uuid4().hex
                answer = httpx.post(  # a new connection each: the kernel picks the worker
                    router.url + "/v1/chat/completions",
                    timeout=60,
                    headers={"x-request-id": request_id},
                    json={"model": MODEL, "messages": messages, "max_tokens": 8},
                )
                assert answer.status_code == 200, answer.text
                turns.append((answer.headers["x-promptedge-replica"], request_id))
                messages = [
                    *messages,
                    {"role": "assistant", "content": answer.json()["choices"][0]["message"]["content"]},
                    {"role": "user", "content": f"and then, step {turn + 1}?"},
                ]
                # a user reads the answer before the next turn: without the pause, the owner's
                # last scrape (every 0.25 s) can still show the turn just answered as running,
                # and a replica predicted a decode batch faster wins on this back-to-back turn
                # (one CI run in two split a conversation's third turn, before the stale-scrape fix
                # in router/dispatch/choice.py; which of the two caused it was not proven)
                time.sleep(0.6)
            conversations.append(turns)
        for turns in conversations:
            assert len({replica for replica, _ in turns}) == 1, turns
        workers = [{answered_by(router, request_id) for _, request_id in turns} for turns in conversations]
        assert any(len(pids) > 1 for pids in workers)  # turns of one conversation met different workers
    finally:
        if router is not None:
            router.stop()
        for proc, _ in replicas:
            proc.terminate()
            proc.wait(timeout=30)

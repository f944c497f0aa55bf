"""bench/soak.py's wrong-answer check against real sim answers: it accepts a request's own
answer and rejects the answer of any other request (another prompt or another max_tokens)."""

from __future__ import annotations

import httpx

from tests.bench_script import load_bench

soak = load_bench("soak")


async def test_check_accepts_own_answer_and_rejects_anothers(serve_replica) -> None:
    url = await serve_replica(model=soak.MODEL)
    prompts = soak.Prompts(seed=0)
    asked = [prompts.next() for _ in range(6)]
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        answers = []
        for prompt, max_tokens in asked:
            body = {"model": soak.MODEL, "prompt": prompt, "max_tokens": max_tokens, "echo": True}
            answers.append((await client.post("/v1/completions", json=body)).json())
    for i, (prompt, max_tokens) in enumerate(asked):
        assert soak.check(answers[i], prompt, max_tokens)
        for j, other in enumerate(answers):
            if asked[j] != asked[i]:
                assert not soak.check(other, prompt, max_tokens)
    assert not soak.check({"error": {"message": "x"}}, *asked[0])


def test_every_phase_has_a_before_and_after() -> None:
    schedule = soak.Schedule.of(180.0)
    phases = [schedule.phase_at(t) for t in range(180)]
    assert phases[0] == "warmup" and phases[-1] == "after_hang_released"
    assert sorted(set(phases), key=phases.index) == schedule.phases()

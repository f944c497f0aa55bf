"""The stuck-generation judgement (router/fleet/progress.py) and how health and the replica use it:
explicit clocks, no I/O."""

from __future__ import annotations

from router.fleet.health import HealthConfig, HealthState
from router.fleet.progress import Progress

N = 10.0  # stuck_after_s


def test_a_stream_that_receives_nothing_for_the_bound_takes_the_replica_out() -> None:
    p = Progress(N)
    p.opened("a", 100.0, streamed=True)
    assert not p.stuck(109.9) and p.admits(109.9)
    assert p.stuck(110.0) and not p.admits(110.0)
    assert p.quiet_s(112.0) == 12.0


def test_any_byte_from_the_replica_is_progress() -> None:
    p = Progress(N)
    p.opened("a", 100.0, streamed=True)
    p.opened("b", 101.0, streamed=True)
    p.advanced(105.0)  # one of its streams received a chunk
    assert not p.stuck(114.9)
    assert p.stuck(115.0)


def test_a_stuck_replica_comes_back_when_it_progresses() -> None:
    p = Progress(N)
    p.opened("a", 100.0, streamed=True)
    assert not p.admits(111.0)
    p.advanced(112.0)
    assert not p.stuck(112.0) and p.admits(112.0) and not p.out(112.0)


def test_a_request_sent_after_a_long_idle_spell_gets_the_whole_bound() -> None:
    p = Progress(N)
    p.advanced(0.0)
    p.opened("a", 500.0, streamed=True)
    assert not p.stuck(509.0) and p.stuck(510.0)


def test_non_stream_requests_are_no_evidence_of_silence() -> None:
    # a whole answer comes only after the whole generation: minutes of silence are normal
    p = Progress(N)
    p.opened("a", 100.0, streamed=False)
    assert not p.stuck(1000.0) and p.admits(1000.0)


def test_after_its_silent_requests_end_one_trial_at_a_time_until_it_progresses() -> None:
    p = Progress(N)
    p.opened("a", 100.0, streamed=True)
    assert not p.admits(111.0)
    p.closed("a")  # timed out or the client left: still no evidence it works
    assert p.out(112.0) and p.admits(112.0)  # a trial may go
    p.opened("t", 112.0, streamed=True)
    assert not p.admits(113.0)  # only one
    p.closed("t")
    p.opened("t2", 114.0, streamed=True)
    p.advanced(114.5)
    p.opened("u", 114.6, streamed=True)
    assert p.admits(114.6) and not p.out(114.6)


def test_metrics_a_running_replica_whose_generation_counter_stands_still_is_stuck() -> None:
    p = Progress(N)
    p.scraped(100.0, running=2.0, generated=500.0)
    p.scraped(105.0, running=2.0, generated=800.0)  # advancing: progress at 105
    p.scraped(110.0, running=2.0, generated=800.0)
    assert not p.stuck(114.9)
    p.scraped(115.0, running=2.0, generated=800.0)
    assert p.stuck(115.0)
    p.scraped(116.0, running=2.0, generated=801.0)
    assert not p.stuck(116.0)


def test_metrics_an_idle_replica_is_not_stuck_and_an_old_scrape_says_nothing() -> None:
    p = Progress(N)
    p.scraped(100.0, running=0.0, generated=800.0)
    p.scraped(200.0, running=0.0, generated=800.0)
    assert not p.stuck(200.0)
    p.scraped(201.0, running=1.0, generated=800.0)
    assert not p.stuck(210.0) and p.stuck(211.0)
    # scrapes stopped answering: a verdict needs a scrape of the last stuck_after_s
    assert not p.stuck(211.0 + N + 0.1)


def test_metrics_without_the_counter_say_nothing() -> None:
    p = Progress(N)
    p.scraped(100.0, running=3.0, generated=None)
    assert not p.stuck(1000.0)


def test_a_counter_reset_is_progress() -> None:
    p = Progress(N)
    p.scraped(100.0, running=1.0, generated=800.0)
    p.scraped(109.0, running=1.0, generated=3.0)  # the replica restarted
    assert not p.stuck(110.0)


def test_health_admits_no_stuck_replica_but_as_a_last_resort() -> None:
    health = HealthState(HealthConfig(stuck_after_s=N))
    health.probe(True)
    health.progress.opened("a", 100.0, streamed=True)
    assert not health.admits(111.0)
    # a pool whose every replica is judged stuck still asks one rather than answer 503:
    # never worse than before the judgement existed
    assert health.admits(111.0, last_resort=True)

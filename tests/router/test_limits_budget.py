"""router.process.limits.connection_budget: how the open-files limit is shared (pure, no I/O)."""

from __future__ import annotations

import pytest

from router.process.limits import OTHER_FDS, Limits, connection_budget


def _fits(nofile: int, budget_clients: int, reserve: int, upstream: int) -> bool:
    return budget_clients + reserve + upstream + OTHER_FDS <= nofile


def test_a_large_limit_keeps_the_upstream_pool_and_gives_clients_the_rest() -> None:
    budget = connection_budget(1_048_576, Limits(), upstream_max=1000)
    assert budget.upstream == 1000 and budget.note == ""
    assert budget.clients == 1_048_576 - OTHER_FDS - 16 - 1000
    assert _fits(1_048_576, budget.clients, budget.reserve, budget.upstream)


def test_a_small_limit_is_shared_and_says_what_it_reduced() -> None:
    # 1,024 open files with the default 1,000 upstream connections: both cannot fit.
    budget = connection_budget(1024, Limits(), upstream_max=1000)
    assert _fits(1024, budget.clients, budget.reserve, budget.upstream)
    assert budget.clients >= 400 and budget.upstream >= 400
    assert "upstream connections 1000 ->" in budget.note


def test_a_configured_cap_that_fits_is_kept_and_one_that_does_not_is_reduced() -> None:
    assert connection_budget(4096, Limits(max_client_connections=500), upstream_max=1000).clients == 500
    budget = connection_budget(1024, Limits(max_client_connections=5000), upstream_max=100)
    assert _fits(1024, budget.clients, budget.reserve, budget.upstream)
    assert budget.clients < 5000 and "client connections 5000 ->" in budget.note


def test_a_limit_without_room_for_connections_is_an_error() -> None:
    with pytest.raises(ValueError, match="RLIMIT_NOFILE 100"):
        connection_budget(100, Limits(), upstream_max=10)


def test_the_limits_setting_is_json_and_rejects_unknown_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError

    from router.settings import RouterSettings

    monkeypatch.setenv("PROMPTEDGE_ROUTER_LIMITS", '{"max_body_bytes": 1024, "header_timeout_s": 2.5}')
    limits = RouterSettings().limits
    assert (limits.max_body_bytes, limits.header_timeout_s, limits.max_headers) == (1024, 2.5, 100)
    monkeypatch.setenv("PROMPTEDGE_ROUTER_LIMITS", '{"max_body_byte": 1024}')  # a typo is not ignored
    with pytest.raises(ValidationError, match="max_body_byte"):
        RouterSettings()

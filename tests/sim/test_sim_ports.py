"""sim.stack's port helpers, which the Redis topologies (Cluster bus at +10,000) and the loop's
control plane (etcd's peer and metrics ports next to its client port) rely on."""

from __future__ import annotations

import socket

from sim.stack import free_port, port_free


def test_a_port_held_by_a_socket_is_not_free_and_is_free_again_once_released() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port = int(held.getsockname()[1])
        assert not port_free(port)
    assert port_free(port)


def test_free_port_gives_a_port_that_can_be_bound() -> None:
    port = free_port()
    assert 0 < port < 65536 and port_free(port)

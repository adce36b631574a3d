"""The ports the monitor and the tests pick for listeners stay out of the way of client connections."""

from __future__ import annotations

import socket

from monitor.pipeline import broker


def test_a_free_port_lies_below_the_range_client_connections_take_and_is_never_handed_out_twice():
    ports = [broker.free_port() for _ in range(200)]
    low, _ = broker._ephemeral_range()
    assert all(broker._EPHEMERAL_FLOOR <= p < low for p in ports)
    assert len(set(ports)) == len(ports)


def test_a_port_another_listener_holds_is_skipped(monkeypatch):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", broker.free_port()))
        held.listen()
        taken = held.getsockname()[1]
        broker._HANDED_OUT.discard(taken)
        draws, real = iter([taken, taken]), broker._PORT_DRAW

        class Draw:  # the held port twice, then the real draw
            def randrange(self, low, high):
                return next(draws, None) or real.randrange(low, high)

        monkeypatch.setattr(broker, "_PORT_DRAW", Draw())
        port = broker.free_port()
        assert port != taken and next(draws, None) is None
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))

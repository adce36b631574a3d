"""The ports the monitor and the tests pick for listeners stay out of the way of client connections."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from monitor.pipeline import broker

RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def test_a_free_port_lies_outside_the_range_client_connections_take_and_is_never_handed_out_twice():
    spans = broker.listening_spans()
    if not spans:
        pytest.skip("this machine leaves no port outside its ephemeral range: free_port falls back to bind(0)")
    ports = [broker.free_port() for _ in range(200)]
    assert all(any(a <= p < b for a, b in spans) for p in ports)
    assert len(set(ports)) == len(ports)


@pytest.mark.skipif(not RANGE.exists(), reason="no Linux ephemeral port range to read")
def test_the_spans_leave_out_the_kernels_client_ports():
    low, high = (int(v) for v in RANGE.read_text().split())
    assert all(b <= low or a > high for a, b in broker.listening_spans())


def test_a_port_another_listener_holds_is_skipped(monkeypatch):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", broker.free_port()))
        held.listen()
        taken = held.getsockname()[1]
        broker._HANDED_OUT.discard(taken)
        draws = iter([taken, taken])
        real = broker._draw

        def draw(spans):  # the held port twice, then the real draw
            return next(draws, None) or real(spans)

        monkeypatch.setattr(broker, "_draw", draw)
        port = broker.free_port()
        assert port != taken and next(draws, None) is None
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))

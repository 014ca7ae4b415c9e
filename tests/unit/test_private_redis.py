"""A test's own Redis is its own: taken ports are never mistaken for it."""

from __future__ import annotations

import socket

import pytest

from tests.private_redis import PrivateRedis


def test_a_first_start_on_a_taken_port_moves_to_a_free_one_and_a_restart_never_moves(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = PrivateRedis(tmp_path)
        server.port = taken.getsockname()[1]  # taken between the pick and the start
        server.start()
        try:
            assert server.port != taken.getsockname()[1] and server.ping()
            server.stop()
            moved = server.port
            server.port = taken.getsockname()[1]  # its port taken while it was down
            with pytest.raises(RuntimeError, match="could not listen"):
                server.start()
            server.port = moved
            server.start()
            assert server.ping()
        finally:
            server.stop()

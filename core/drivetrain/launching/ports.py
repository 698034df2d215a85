"""A free TCP port, for a launcher's rendezvous on this machine (``drivetrain launch``, the forked launchers,
plugins' launchers through ``drivetrain.plugin_api.free_port``)."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on now (for a launcher's rendezvous on this machine)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host if host in ("127.0.0.1", "localhost", "0.0.0.0") else "", 0))
        return sock.getsockname()[1]

"""No network in a harness run, and no waiting for it.

peft's ``hub_online_once`` switches the hub's offline mode off for each model id it first sees, and the hub
client retries a failed connection five times with a growing pause (~23-46 s a test). Here a connection to
anything but this machine fails at once (name lookup included), the hub client's retry pause is skipped (every
retry would fail the same way), and the pytest test that tried is appended to a log, so the harness can count
the tests that need the hub apart on both sides.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys

MESSAGE = "hfstack: no network in this run (only this machine is reachable)"
_LOCAL_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", ""}
_log_path = ""


def _is_local(host) -> bool:
    if host is None:
        return True
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    host = str(host).strip("[]").lower()
    if host in _LOCAL_NAMES:
        return True
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified


def _record() -> None:
    test = os.environ.get("PYTEST_CURRENT_TEST", "")
    test = test.rsplit(" (", 1)[0]  # "path::Class::test (call)" -> the test id
    try:
        with open(_log_path, "a", encoding="utf-8") as log:
            log.write(f"{test or '<outside a test>'}\n")
    except OSError:
        pass


_real_getaddrinfo = socket.getaddrinfo
_real_connect = socket.socket.connect
_real_connect_ex = socket.socket.connect_ex


def _getaddrinfo(host, *args, **kwargs):
    if not _is_local(host):
        _record()
        raise socket.gaierror(socket.EAI_NONAME, f"{MESSAGE}: {host}")
    return _real_getaddrinfo(host, *args, **kwargs)


def _blocked(sock, address) -> bool:
    return sock.family in (socket.AF_INET, socket.AF_INET6) and not _is_local(address[0])


def _connect(self, address):
    if _blocked(self, address):
        _record()
        raise ConnectionRefusedError(111, f"{MESSAGE}: {address[0]}")
    return _real_connect(self, address)


def _connect_ex(self, address):
    if _blocked(self, address):
        _record()
        return 111  # ECONNREFUSED
    return _real_connect_ex(self, address)


class _NoPause:
    """Stands for the ``time`` module inside huggingface_hub's HTTP helpers: retries happen without waiting."""

    def __getattr__(self, name):
        import time

        return getattr(time, name)

    @staticmethod
    def sleep(seconds) -> None:
        return None


def _skip_hub_retry_pause(module) -> None:
    if hasattr(module, "time"):
        module.time = _NoPause()


class _AfterImport:
    """Runs a function on a module right after it is first imported (the hub client loads late, or never)."""

    def __init__(self, name: str, action):
        self.name, self.action = name, action

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader, action = spec.loader, self.action
        original_exec = loader.exec_module

        def exec_module(module):
            original_exec(module)
            action(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install(log_path: str) -> None:
    global _log_path
    _log_path = log_path
    socket.getaddrinfo = _getaddrinfo
    socket.socket.connect = _connect  # type: ignore[method-assign]
    socket.socket.connect_ex = _connect_ex  # type: ignore[method-assign]
    hub_http = "huggingface_hub.utils._http"
    if hub_http in sys.modules:
        _skip_hub_retry_pause(sys.modules[hub_http])
    else:
        sys.meta_path.insert(0, _AfterImport(hub_http, _skip_hub_retry_pause))

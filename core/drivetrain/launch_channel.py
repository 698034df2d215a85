"""How the processes of a launch talk to their launcher: a socket on the loopback interface, not files.

``drivetrain launch`` listens on ``127.0.0.1`` and gives every process its address and a secret token
(``DRIVETRAIN_LAUNCH_CHANNEL=host:port:token``). A process sends one JSON line per message and reads one
JSON line back:

- ``{"kind": "failure", "rank", "attempt", "error", "traceback"}``: its script ended with an uncaught
  error. The launcher answers ``{"first": true}`` to the first failure of an attempt (torch's restart
  count), ``false`` to the others, so that only the first prints its traceback (see failure_report.py);
  the launcher keeps every traceback for its failure report.
- ``{"kind": "backend", "name", "source"}``: the backend process 0 selected, for the line after the run.

Why a socket: files in the temporary folder stay behind when the launcher is killed (SIGKILL, a crashed
machine), and nothing is left to remove them; a socket goes away with the process that owns it. The token
keeps other users of the machine from speaking on it.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
import socket
import threading
from typing import Any

CHANNEL_ENV = "DRIVETRAIN_LAUNCH_CHANNEL"
#: Seconds a process waits for the launcher: a launcher that does not answer must not hold up an exit.
TIMEOUT = 5.0
#: A message is one line of JSON; a traceback is cut before it gets near this.
MAX_MESSAGE_BYTES = 1024 * 1024


def send(message: dict[str, Any]) -> dict[str, Any] | None:
    """Send ``message`` to this process's launcher and return its answer; None when no launcher listens
    (the script was not started by ``drivetrain launch``) or it did not answer in time."""
    address = os.environ.get(CHANNEL_ENV)
    if not address:
        return None
    try:
        host, port, token = address.rsplit(":", 2)
        with socket.create_connection((host, int(port)), timeout=TIMEOUT) as connection:
            connection.sendall(json.dumps({**message, "token": token}).encode("utf-8") + b"\n")
            answer = _read_line(connection)
        return json.loads(answer) if answer else None
    except (OSError, ValueError):
        return None


def _read_line(connection: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n") and len(data) <= MAX_MESSAGE_BYTES:
        chunk = connection.recv(65536)
        if not chunk:
            break
        data += chunk
    return data.strip() if data.endswith(b"\n") else b""


class LaunchChannel:
    """The launcher's end: listens on a loopback port from construction until :meth:`close`, collecting
    what the processes send. Use it as a context manager around the run."""

    def __init__(self) -> None:
        self.token = secrets.token_hex(16)
        #: failure records in the order they arrived: {"rank", "attempt", "error", "traceback"}
        self.failures: list[dict[str, Any]] = []
        #: (backend name, where the script's choice came from), as process 0 reported it
        self.backend: tuple[str, str] | None = None
        self._lock = threading.Lock()
        self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(64)
        self._thread = threading.Thread(target=self._serve, name="drivetrain-launch-channel", daemon=True)
        self._thread.start()

    @property
    def environment(self) -> dict[str, str]:
        """What the processes need to reach this channel."""
        host, port = self._server.getsockname()[:2]
        return {CHANNEL_ENV: f"{host}:{port}:{self.token}"}

    def first_failure(self) -> dict[str, Any] | None:
        """The first failure record of the latest attempt that has one (None when no process reported)."""
        with self._lock:
            if not self.failures:
                return None
            latest = max(record["attempt"] for record in self.failures)
            return next(record for record in self.failures if record["attempt"] == latest)

    def close(self) -> None:
        try:
            self._server.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # not connected: closing below is enough
        self._server.close()
        self._thread.join(TIMEOUT)

    def __enter__(self) -> LaunchChannel:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # -- serving -----------------------------------------------------------------------------------------------
    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self._server.accept()
            except OSError:
                return  # closed
            with connection:
                connection.settimeout(TIMEOUT)
                try:
                    answer = self._answer(json.loads(_read_line(connection) or b"null"))
                    connection.sendall(json.dumps(answer).encode("utf-8") + b"\n")
                except (OSError, ValueError, KeyError, TypeError):
                    continue  # a process that went away mid-message, or a stranger: nothing to keep

    def _answer(self, message: Any) -> dict[str, Any]:
        if not isinstance(message, dict) or not hmac.compare_digest(
            str(message.get("token", "")), self.token
        ):
            return {}
        kind = message.get("kind")
        with self._lock:
            if kind == "failure":
                record = {
                    "rank": int(message["rank"]),
                    "attempt": int(message.get("attempt", 0)),
                    "error": str(message.get("error", "")),
                    "traceback": str(message.get("traceback", "")),
                }
                first = not any(earlier["attempt"] == record["attempt"] for earlier in self.failures)
                self.failures.append(record)
                return {"first": first}
            if kind == "backend":
                self.backend = (str(message.get("name", "")), str(message.get("source", "")))
        return {}

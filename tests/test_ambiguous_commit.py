"""An ambiguous commit of the completion (P2, issue #25 hole 10): the write reached PostgreSQL, its
reply never came back. The holder re-reads its record at its own claim token before deciding, so it
sends ``task_completed``, not ``lease_lost``; the body runs once."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from django_idempotent_tasks import signals
from django_idempotent_tasks.models import IdempotencyRecord
from tests.helpers import calls
from tests.testapp import tasks

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the proxy reads PostgreSQL's protocol"),
]
#: How long the proxy lets the server act on the cut message before it closes both sides.
SERVER_ACTS = 0.5


class ReplyDropper:
    """A TCP proxy to the database that, once armed, forwards the next client message holding
    ``marker``, never forwards the server's reply to it, and then cuts both connections."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0), reuse_port=False)  # a free port
        self.port: int = self.listener.getsockname()[1]
        self.marker = b""
        self.passing = 0  # messages holding the marker forwarded untouched before the one cut
        self.muted = threading.Event()
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self.accept, daemon=True).start()

    def arm(self, marker: bytes, passing: int = 0) -> None:
        self.marker, self.passing = marker, passing

    def accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            self.sockets += [client, server]
            threading.Thread(target=self.pipe, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self.pipe, args=(server, client, False), daemon=True).start()

    def pipe(self, source: socket.socket, sink: socket.socket, upstream: bool) -> None:
        try:
            while data := source.recv(65536):
                cut = upstream and self.marker and self.marker in data
                if cut and self.passing:
                    self.passing, cut = self.passing - 1, False
                if cut:
                    self.marker = b""
                    self.muted.set()  # the reply is never forwarded
                if upstream or not self.muted.is_set():
                    sink.sendall(data)
                if cut:
                    time.sleep(SERVER_ACTS)
                    break
        except OSError:
            pass
        for end in (source, sink):
            with_closed(end)
        if upstream:
            self.muted.clear()

    def close(self) -> None:
        with_closed(self.listener)  # shutdown wakes the thread blocked in accept(): the port is free
        for end in self.sockets:
            with_closed(end)


def with_closed(end: socket.socket) -> None:
    with contextlib.suppress(OSError):
        end.shutdown(socket.SHUT_RDWR)
    end.close()


@pytest.fixture
def proxy() -> Iterator[ReplyDropper]:
    """The test's database connection through a ReplyDropper."""
    settings = connection.settings_dict
    dropper = ReplyDropper(settings["HOST"] or "127.0.0.1", int(settings["PORT"] or 5432))
    port = settings["PORT"]
    connection.close()
    settings["PORT"] = str(dropper.port)
    try:
        yield dropper
    finally:
        connection.close()
        settings["PORT"] = port
        dropper.close()


@pytest.fixture
def sent() -> Iterator[list[str]]:
    """The names of the signals sent, in order."""
    names: list[str] = []
    receivers = []
    for name in ("task_completed", "lease_lost", "result_unstorable", "task_failed"):

        def receiver(sender: Any, name: str = name, **kwargs: Any) -> None:
            names.append(name)

        getattr(signals, name).connect(receiver)
        receivers.append((name, receiver))
    yield names
    for name, receiver in receivers:
        getattr(signals, name).disconnect(receiver)


def test_10_an_ambiguous_completion_is_read_back_not_taken_for_a_lost_lease(
    proxy: ReplyDropper, sent: list[str]
) -> None:
    proxy.arm(b"SUCCEEDED")  # the completion's UPDATE (autocommit: its reply is the commit's)
    result = tasks.plain_result.apply(("plain",), {"idempotency_key": "p2"}, throw=True).get()
    assert result == {"value": "plain"}
    record = IdempotencyRecord.objects.get(key="p2")
    assert (record.status, record.fence, record.result) == ("SUCCEEDED", 1, result)
    assert sent == ["task_completed"]
    assert calls("p2") == 1


def test_10_an_ambiguous_atomic_commit_is_read_back_and_signalled(
    proxy: ReplyDropper, sent: list[str]
) -> None:
    proxy.arm(b"COMMIT")
    result = tasks.atomic_plain_result.apply(("plain",), {"idempotency_key": "p2-atomic"}, throw=True).get()
    assert result == {"value": "plain"}
    record = IdempotencyRecord.objects.get(key="p2-atomic")
    assert (record.status, record.fence, record.result) == ("SUCCEEDED", 1, result)
    assert sent == ["task_completed"]
    assert calls("p2-atomic") == 1

"""The client-side deadline of a bounded call (issue #25): a socket whose call outlived it is shut down."""

from __future__ import annotations

import socket
import threading
import time

from django_idempotent_tasks import deadlines
from tests.helpers import wait_for

#: A peer that answers only this late: an uncut wait would get its answer instead of an end of file.
LATE_ANSWER = 60
#: Shorter than a call in these tests ever takes to be cut, longer than it takes to finish.
DEADLINE = 0.3


def late_peer() -> tuple[socket.socket, socket.socket, threading.Timer]:
    mine, theirs = socket.socketpair()
    answer = threading.Timer(LATE_ANSWER, lambda: theirs.sendall(b"late"))
    answer.start()
    return mine, theirs, answer


def test_a_call_past_its_deadline_finds_its_socket_shut_down() -> None:
    mine, theirs, answer = late_peer()
    try:
        with deadlines.cut_after(mine.fileno(), DEADLINE):
            received = mine.recv(4)
        assert received == b""  # the end of file the driver turns into OperationalError
    finally:
        answer.cancel()
        mine.close()
        theirs.close()


def test_a_call_that_ended_in_time_keeps_its_socket() -> None:
    mine, theirs = socket.socketpair()
    try:
        with deadlines.cut_after(mine.fileno(), DEADLINE):
            theirs.sendall(b"ok")
            assert mine.recv(2) == b"ok"
        # Past the deadline the watchdog has looked at every armed call: this one was disarmed.
        time.sleep(DEADLINE + 3 * deadlines.TICK)
        theirs.sendall(b"still")
        assert mine.recv(5) == b"still"
    finally:
        mine.close()
        theirs.close()


def test_the_watchdog_wakes_from_its_idle_sleep_for_a_new_call() -> None:
    with deadlines.cut_after(-1, 0):  # a deadline due at once on no socket: nothing to shut down
        pass
    wait_for(
        lambda: deadlines._watchdog.parked, timeout=deadlines.IDLE_TICKS * deadlines.TICK * 4, what="parked"
    )
    mine, theirs, answer = late_peer()
    try:
        with deadlines.cut_after(mine.fileno(), DEADLINE):
            assert mine.recv(4) == b""
    finally:
        answer.cancel()
        mine.close()
        theirs.close()

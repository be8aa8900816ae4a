"""The client side of a bounded call: past its deadline, the connection's socket is shut down.

A database that stopped answering behind a TCP peer that is still alive (a partition at a proxy,
a pooler or a load balancer) cancels nothing and the kernel sees no dead link: keepalives and
TCP_USER_TIMEOUT never fire, and a statement timeout never reaches the server. Only the client can
end the wait. One thread per process checks the armed deadlines a few times a second; a call that
outlives its deadline finds its socket shut down, and its driver raises OperationalError.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator

#: Allowed past the server-side bound before the client cuts: a server that still answers reports
#: its own timeout first (a clean error on a connection that stays usable).
GRACE = 1.0
#: How often the deadlines are checked, in seconds.
TICK = 0.25
#: Ticks with nothing armed before the thread sleeps until the next call is armed.
IDLE_TICKS = 40


class _Watchdog:
    def __init__(self) -> None:
        self.condition = threading.Condition()
        self.armed: dict[int, tuple[float, int]] = {}  # ticket: (deadline, file descriptor)
        self.tickets = 0
        self.pid: int | None = None
        self.parked = False

    def arm(self, fd: int, seconds: float) -> int:
        with self.condition:
            if self.pid != os.getpid():  # first use in this process (or a forked child): no thread yet
                self.pid, self.armed, self.parked = os.getpid(), {}, False
                threading.Thread(target=self.run, name="idempotency-deadlines", daemon=True).start()
            self.tickets += 1
            self.armed[self.tickets] = (time.monotonic() + seconds, fd)
            # Woken only from its idle sleep: a notify for every call cost a context switch each.
            if self.parked:
                self.parked = False
                self.condition.notify()
            return self.tickets

    def disarm(self, ticket: int) -> None:
        # Under the lock: once this returns, the socket (still open) can no longer be cut.
        with self.condition:
            self.armed.pop(ticket, None)

    def run(self) -> None:
        idle = 0
        with self.condition:
            while True:
                if idle >= IDLE_TICKS:
                    self.parked = True
                    while self.parked:
                        self.condition.wait()
                    idle = 0
                self.condition.wait(TICK)
                idle = 0 if self.armed else idle + 1
                now = time.monotonic()
                for ticket, (deadline, fd) in list(self.armed.items()):
                    if deadline <= now:
                        del self.armed[ticket]
                        _shut_down(fd)


def _shut_down(fd: int) -> None:
    # shutdown() acts on the socket itself, so on the driver's descriptor too; only the copy is closed.
    with contextlib.suppress(OSError), socket.socket(fileno=os.dup(fd)) as copy:
        copy.shutdown(socket.SHUT_RDWR)


_watchdog = _Watchdog()


@contextlib.contextmanager
def cut_after(fd: int, seconds: float) -> Iterator[None]:
    """Shut down the socket ``fd`` if the block inside has not ended ``seconds`` from now."""
    ticket = _watchdog.arm(fd, seconds)
    try:
        yield
    finally:
        _watchdog.disarm(ticket)

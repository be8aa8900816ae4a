"""RELIABILITY.md fault P2, the ambiguous commit: a TCP proxy that forwards a statement and drops its reply."""

from __future__ import annotations

import contextlib
import socket
import threading


class _Pair:
    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client = client
        self.server = server
        self.drop = threading.Event()

    def close(self) -> None:
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


class DropProxy:
    """Listens on ``port`` (0: a free one) and forwards to ``target``; ``arm(port)`` makes the connection whose
    client side is that local port lose the next reply, after which both ends are closed (the
    server has executed, and in autocommit committed, what it was sent)."""

    def __init__(self, port: int, target: tuple[str, int]) -> None:
        self.target = target
        self.pairs: dict[int, _Pair] = {}
        self.lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", port), reuse_port=False)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.port: int = self.listener.getsockname()[1]  # the one the system chose for port 0

    def start(self) -> DropProxy:
        threading.Thread(target=self._accept, name="drop-proxy", daemon=True).start()
        return self

    def arm(self, client_port: int) -> bool:
        """Drop the next reply on that connection; False if the proxy does not carry it."""
        with self.lock:
            pair = self.pairs.get(client_port)
        if pair is None:
            return False
        pair.drop.set()
        return True

    def stop(self) -> None:
        self.listener.close()
        with self.lock:
            pairs = list(self.pairs.values())
        for pair in pairs:
            pair.close()

    def _accept(self) -> None:
        while True:
            try:
                client, address = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            pair = _Pair(client, server)
            with self.lock:
                self.pairs[address[1]] = pair
            threading.Thread(target=self._pump, args=(pair, client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(pair, server, client, True), daemon=True).start()

    def _pump(self, pair: _Pair, source: socket.socket, sink: socket.socket, reply: bool) -> None:
        try:
            while data := source.recv(65536):
                if reply and pair.drop.is_set():
                    break
                sink.sendall(data)
        except OSError:
            pass
        pair.close()

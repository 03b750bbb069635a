"""A TCP link on 127.0.0.1 that a test can cut and restore: one host's route to a shared service.

``Link(port)`` listens on a free port and forwards every connection to ``127.0.0.1:port``.
:meth:`Link.cut` resets every open connection and resets each new one as soon as it is accepted
(the host has lost its route: every request fails at once); :meth:`Link.restore` forwards again.
Only a test's own host is pointed at the link, so the other host keeps its direct route.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading

from tests.s3server import free_port


def _reset(sock: socket.socket) -> None:
    """Close ``sock`` with a TCP RST (SO_LINGER 0), so the peer sees its connection reset."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


class Link:
    """A cuttable TCP forwarder to ``127.0.0.1:target_port`` (see the module docstring)."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.port = free_port()
        self.up = True
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._server = socket.create_server(("127.0.0.1", self.port))
        self._closed = False
        threading.Thread(target=self._accept, name=f"link-{self.port}", daemon=True).start()

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cut(self) -> None:
        """Every open connection is reset and every new one refused until :meth:`restore`."""
        with self._lock:
            self.up = False
            gone, self._open = self._open, set()
        for sock in gone:
            _reset(sock)

    def restore(self) -> None:
        with self._lock:
            self.up = True

    def close(self) -> None:
        self._closed = True
        self.cut()
        with contextlib.suppress(OSError):
            self._server.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            with self._lock:
                up = self.up
            if not up:
                _reset(client)
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=10)
            except OSError:
                _reset(client)
                continue
            with self._lock:
                self._open.update((client, upstream))
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._open.discard(src)
                self._open.discard(dst)
            for sock in (src, dst):  # the other direction's pump then ends too
                with contextlib.suppress(OSError):
                    sock.close()

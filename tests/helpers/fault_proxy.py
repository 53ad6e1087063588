"""An HTTP proxy on 127.0.0.1 in front of a test's S3 server, which counts and damages traffic.

``with FaultProxy(server.endpoint_url) as proxy:`` point a client at ``proxy.url``; every
request goes on to the server as it came (its Host header too, so SigV4 signatures still
match). ``proxy.requests`` counts them by (method, path). ``proxy.rules`` is a list of
``(method, path substring, action, times)``: the next ``times`` matching requests get
``action`` instead of a plain answer:

- ``"flip"``: the server's answer with one byte of its body flipped (damage in transit), a
  byte further on each time;
- ``"503"``: an S3 ``503 SlowDown`` error, the server never asked (throttling);
- ``"drop"``: the connection closed with no answer (a network cut);
- ``"hang"``: no answer at all (a hung server) for ``hang_s`` seconds, or until ``release()``
  when it is None, then the connection is closed;
- ``"pass"``: the plain answer (a rule that lets the first requests of a later one through).

Bodies are read whole: the test objects are small.
"""

from __future__ import annotations

import http.client
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

__all__ = ["FaultProxy"]

_SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade"}


class FaultProxy:
    """See the module."""

    def __init__(self, endpoint_url: str) -> None:
        target = urlsplit(endpoint_url)
        self.target = (target.hostname or "127.0.0.1", target.port or 80)
        self.requests: Counter[tuple[str, str]] = Counter()
        self.rules: list[list[Any]] = []
        self.applied: Counter[str] = Counter()
        self.hang_s: float | None = None
        self._released = threading.Event()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def add(self, method: str, path_part: str, action: str, times: int = 1) -> None:
        """The next ``times`` requests ``method`` of a path containing ``path_part`` get
        ``action``."""
        with self._lock:
            self.rules.append([method, path_part, action, times])

    def release(self) -> None:
        """End the hangs of ``"hang"`` rules (their connections close, unanswered), and those
        to come."""
        self._released.set()

    def count(self, method: str, path_part: str) -> int:
        """Requests ``method`` of paths containing ``path_part`` so far."""
        with self._lock:
            return sum(n for (m, p), n in self.requests.items() if m == method and path_part in p)

    def _action(self, method: str, path: str) -> tuple[str | None, int]:
        """The action for this request, and how many times it was applied before."""
        with self._lock:
            self.requests[(method, path.split("?")[0])] += 1
            for rule in self.rules:
                if rule[0] == method and rule[1] in path and rule[3] > 0:
                    rule[3] -= 1
                    self.applied[rule[2]] += 1
                    return str(rule[2]), self.applied[rule[2]] - 1
        return None, 0


def _handler(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # (quiet)
            pass

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            action, before = proxy._action(self.command, self.path)
            if action == "hang":
                proxy._released.wait(proxy.hang_s)
            if action in ("drop", "hang"):
                self.close_connection = True
                self.connection.close()
                return
            if action == "503":
                self.send_response(503, "Slow Down")
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(_SLOW_DOWN)))
                self.end_headers()
                self.wfile.write(_SLOW_DOWN)
                return
            upstream = http.client.HTTPConnection(*proxy.target, timeout=60)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                upstream.request(self.command, self.path, body=body, headers=headers)
                answer = upstream.getresponse()
                data = answer.read()
            finally:
                upstream.close()
            if action == "flip" and data:
                flipped = bytearray(data)
                flipped[(len(flipped) // 2 + before) % len(flipped)] ^= 0xFF
                data = bytes(flipped)
            self.send_response(answer.status, answer.reason)
            for key, value in answer.getheaders():
                if key.lower() not in _HOP_BY_HOP and key.lower() != "content-length":
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

    return Handler

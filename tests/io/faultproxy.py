"""A fault-injecting HTTP proxy on 127.0.0.1, in front of a local S3 server (moto).

    with FaultProxy(upstream_port, mode="throttle", rate=0.05, seed=3) as proxy:
        env["AWS_ENDPOINT_URL"] = proxy.url

Each request is forwarded to ``127.0.0.1:upstream_port`` unless a fault is drawn for it
(a ``random.Random(seed)``, one draw per request, ``rate`` the chance of a fault):

- ``throttle``: answered ``503`` with S3's ``SlowDown`` XML, not forwarded;
- ``error200``: a CopyObject or CompleteMultipartUpload answered ``200 OK`` with an
  ``InternalError`` XML body, not forwarded (S3 reports a failed copy or completion so);
- ``drop``: forwarded, then the connection closed without a reply (the server acted, the
  client never hears);
- ``outage``: from the first drawn fault on, every connection is closed unanswered for
  ``outage_s`` seconds.

``max_faults`` bounds the faults of one proxy (the draws go on, so a seed's faults fall
on the same requests whatever the bound).

Only loopback traffic: it listens on 127.0.0.1 and forwards to 127.0.0.1. It stops with
its ``with`` block, or after ``lifetime_s`` seconds whatever happens (a daemon timer).
"""

from __future__ import annotations

import http.client
import random
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODES = ("throttle", "error200", "drop", "outage")

_SLOWDOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message><RequestId>F1</RequestId></Error>"
)
_INTERNAL = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InternalError</Code>'
    b"<Message>We encountered an internal error. Please try again.</Message>"
    b"<RequestId>F2</RequestId></Error>"
)
_HOP = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "proxy-connection",
    "te",
    "upgrade",
    "expect",
}


class FaultProxy:
    """See the module docstring. ``counts`` holds requests seen and faults injected."""

    def __init__(
        self,
        upstream_port: int,
        *,
        mode: str | None = None,
        rate: float = 0.0,
        seed: int = 0,
        outage_s: float = 3.0,
        max_faults: int | None = None,
        lifetime_s: float = 300.0,
    ) -> None:
        if mode is not None and mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}; got {mode!r}.")
        self.upstream_port = upstream_port
        self.mode, self.rate, self.outage_s = mode, rate, outage_s
        self.max_faults = max_faults  # at most this many faults (None: no bound)
        self.rng = random.Random(seed)
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._outage_until = 0.0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # else 40 ms per reply (Nagle + delayed ACK)

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _any(self) -> None:
                proxy._handle(self)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._timer = threading.Timer(lifetime_s, self.stop)
        self._timer.daemon = True

    # --- lifecycle --------------------------------------------------------------------------
    def start(self) -> FaultProxy:
        self._thread.start()
        self._timer.start()
        return self

    def stop(self) -> None:
        self._timer.cancel()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # --- one request ------------------------------------------------------------------------
    def _draw(self, handler: BaseHTTPRequestHandler) -> bool:
        """Whether this request gets the fault (one draw per eligible request)."""
        if self.mode is None:
            return False
        if self.mode == "error200":
            eligible = (handler.command == "PUT" and "x-amz-copy-source" in handler.headers) or (
                handler.command == "POST" and "uploadId=" in handler.path
            )
            if not eligible:
                return False
        with self._lock:
            self.counts["eligible"] += 1
            drawn = self.rng.random() < self.rate
            if self.max_faults is not None and self.counts[self.mode] >= self.max_faults:
                return False  # the draw is still made: the seed's sequence is the same
            return drawn

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        body = _read_body(h)
        with self._lock:
            self.counts["requests"] += 1
            in_outage = time.monotonic() < self._outage_until
        if in_outage:
            self.counts["refused"] += 1
            h.close_connection = True
            return
        fault = self._draw(h)
        if fault:
            self.counts[self.mode] += 1
        if fault and self.mode == "outage":
            with self._lock:
                self._outage_until = time.monotonic() + self.outage_s
                self.mode = None  # one outage per proxy: it ends, the run can finish
            h.close_connection = True
            return
        if fault and self.mode == "throttle":
            _reply(h, 503, _SLOWDOWN)
            return
        if fault and self.mode == "error200":
            _reply(h, 200, _INTERNAL)
            return
        status, headers, payload = self._forward(h, body)
        if fault and self.mode == "drop":  # the server acted; the client never hears
            h.close_connection = True
            return
        h.send_response(status)
        for key, value in headers:
            if key.lower() not in _HOP and (key.lower() != "content-length" or h.command == "HEAD"):
                h.send_header(key, value)
        if h.command != "HEAD":
            h.send_header("Content-Length", str(len(payload)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(payload)

    def _forward(self, h: BaseHTTPRequestHandler, body: bytes) -> tuple[int, list, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.upstream_port, timeout=60)
        try:
            headers = {k: v for k, v in h.headers.items() if k.lower() not in _HOP}
            if body or h.command in ("PUT", "POST"):
                headers["Content-Length"] = str(len(body))
            conn.request(h.command, h.path, body=body, headers=headers)
            resp = conn.getresponse()
            payload = resp.read()
            return resp.status, resp.getheaders(), payload
        finally:
            conn.close()


def _read_body(h: BaseHTTPRequestHandler) -> bytes:
    if h.headers.get("Transfer-Encoding", "").lower() == "chunked":
        chunks = []
        while True:
            size = int(h.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while h.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(chunks)
            chunks.append(h.rfile.read(size))
            h.rfile.readline()
    n = int(h.headers.get("Content-Length") or 0)
    return h.rfile.read(n) if n else b""


def _reply(h: BaseHTTPRequestHandler, status: int, body: bytes) -> None:
    h.send_response(status)
    h.send_header("Content-Type", "application/xml")
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    if h.command != "HEAD":
        h.wfile.write(body)

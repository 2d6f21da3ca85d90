"""A moto S3 server on 127.0.0.1 that starts empty and leaves nothing behind.

moto keeps its S3 state in the process, shared by every server started in it: a
module-scoped server of one test module saw every object the modules before it wrote in
the same pytest worker (the storage-fault runs left about 900 objects, and each refusal
test, which reads the whole bucket twice, took 11-20 s instead of 1 s). So the state is
reset (moto's ``POST /moto-api/reset``) when a server starts and when it stops.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager


def _reset(host: str, port: int) -> None:
    request = urllib.request.Request(f"http://{host}:{port}/moto-api/reset", method="POST")
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.status == 200, f"moto's reset answered {answer.status}"


@contextmanager
def empty_moto_server() -> Iterator[tuple[str, int]]:
    """A moto S3 server on a free port of 127.0.0.1, holding no bucket; yields
    ``(host, port)`` and empties moto's state again when it stops."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        _reset(host, port)
        yield host, port
    finally:
        try:
            _reset(host, port)
        finally:
            server.stop()

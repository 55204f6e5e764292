"""Fetch the next chunk of slot rows while the caller decodes the current one.

A named-cursor FETCH spends much of its time waiting on the server (scanning the function's
result, sending it), with the GIL released. Issuing it from a worker thread lets that wait
overlap with decoding, so fetch + decode costs closer to the larger of the two than their sum.
The worker is the only user of the cursor until it has stopped: ``prefetched`` always joins
it before returning or raising, so the caller may commit or roll back the connection after.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

_DONE = object()


def prefetched(fetch: Callable[[], Sequence[Any]], depth: int = 2) -> Iterator[Sequence[Any]]:
    """Yield ``fetch()`` results until one is empty, fetching up to ``depth`` chunks ahead.

    An exception in ``fetch`` is re-raised here, in the consumer's thread. Closing the generator
    early (or an exception in the consumer) stops the worker after its current fetch.
    """
    chunks: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                chunks.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            while not stop.is_set():
                chunk = fetch()
                if not chunk:
                    break
                if not put(chunk):
                    return
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
            put(exc)
            return
        put(_DONE)

    worker = threading.Thread(target=work, name="pglogical-prefetch", daemon=True)
    worker.start()
    try:
        while True:
            item = chunks.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        worker.join()

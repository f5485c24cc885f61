"""The blob reads of lookups, on daemon threads of their own.

A read that hangs in the kernel (a stuck network mount, an object store that stops answering)
holds one of these threads, never the caller, which gives up at its deadline.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any


class ReaderPool:
    """Daemon threads running blob reads; ``submit`` returns a future at once.

    NOTE: not ``concurrent.futures.ThreadPoolExecutor``: its threads are joined at interpreter
    exit, so one read stuck in the kernel would keep the process from ever exiting.
    """

    def __init__(self, threads: int) -> None:
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]]] = queue.SimpleQueue()
        for i in range(threads):
            threading.Thread(target=self._loop, name=f"kvproxy-reader-{i}", daemon=True).start()

    def submit(self, fn: Callable[[], Any]) -> Future[Any]:
        future: Future[Any] = Future()
        self._jobs.put((future, fn))
        return future

    def _loop(self) -> None:
        while True:
            future, fn = self._jobs.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to the waiting caller
                future.set_exception(exc)


def cancel(reads: Iterable[Future[Any]]) -> None:
    """Cancel the reads not started yet (a running one finishes on its reader thread, unused)."""
    for read in reads:
        read.cancel()

"""Run one function in several threads released at the same instant (races on stores and receipts)."""

from __future__ import annotations

import threading


def race(n: int, fn) -> list[object]:
    """Run ``fn(i)`` in ``n`` threads released together; return each result or exception."""
    barrier = threading.Barrier(n)
    results: list[object] = [None] * n

    def worker(i: int) -> None:
        barrier.wait()
        try:
            results[i] = fn(i)
        except Exception as e:  # noqa: BLE001 - the test inspects it
            results[i] = e

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results

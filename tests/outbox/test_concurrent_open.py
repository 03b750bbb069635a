"""Several processes opening one new outbox at the same moment (the learner creating it while the
driver fences it): every open succeeds, and the file has one schema and one identity."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from gradlab.outbox import Outbox


def _open_at_once(path: str, barrier, results) -> None:
    barrier.wait()
    try:
        outbox = Outbox(Path(path))
        results.put(("ok", outbox.identity()))
        outbox.close()
    except Exception as e:  # noqa: BLE001 - reported to the test, which names it
        results.put(("error", f"{type(e).__name__}: {e}"))


def test_simultaneous_opens_of_a_new_outbox_all_succeed(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    openers = 6
    for round_ in range(15):
        path = tmp_path / f"run-{round_}" / "outbox.sqlite"
        barrier, results = ctx.Barrier(openers), ctx.Queue()
        procs = [ctx.Process(target=_open_at_once, args=(str(path), barrier, results)) for _ in range(openers)]
        for p in procs:
            p.start()
        got = [results.get(timeout=120) for _ in procs]
        for p in procs:
            p.join(timeout=60)
        assert [g for g in got if g[0] != "ok"] == [], f"round {round_}"
        assert len({identity for _, identity in got}) == 1  # one file, one identity

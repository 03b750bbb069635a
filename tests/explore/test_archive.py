"""The state archive on hand-made trajectories: replacement, selection weights, bound, round trip."""

from __future__ import annotations

import numpy as np
import pytest

from gradlab.errors import IntegrityError
from gradlab.explore.archive import Archive, count_runs
from gradlab.explore.cells import FrameCells, SignalCells


def _archive() -> Archive:
    a = Archive(max_cells=3)
    a.visit("root", actions=[], return_=0.0, length=0, progress=0.0, state=b"s0", parent=None)
    a.visit("a", actions=[1, 1, 2], return_=0.0, length=3, progress=0.0, state=b"s1", parent="root")
    return a


def test_a_cell_keeps_the_better_trajectory_and_drops_the_old_blob():
    a = _archive()
    assert not a.visit("a", actions=[1, 1, 2, 3], return_=0.0, length=4, progress=0.0, state=None, parent="root")
    assert a.visit("a", actions=[2, 2], return_=0.0, length=2, progress=0.0, state=b"s1-short", parent="root")
    assert a.cells["a"].actions == [2, 2] and a.update_count == 1
    assert sorted(a.blobs.values()) == [b"s0", b"s1-short"]  # compaction dropped the replaced state
    assert a.visit_count == 4 and a.cells["a"].visits == 3
    m = a.metrics()
    assert m["train/algorithm/go_explore/archive/visits_per_cell"] == 2.0
    assert m["train/algorithm/go_explore/archive/recent_new_cell_rate"] == 0.5


def test_selection_weights_are_one_over_sqrt_of_one_plus_selections():
    a = _archive()
    a.cells["root"].selections = 3  # weight 1/2; "a" has weight 1
    assert a.weights() == pytest.approx([1 / 3, 2 / 3])
    rng = np.random.default_rng(0)
    picks = [a.select(rng).key for _ in range(200)]
    assert 0 < picks.count("root") < picks.count("a")
    assert a.selection_count == 200 and a.cells["root"].selections + a.cells["a"].selections == 203


def test_the_bound_evicts_the_weakest_cell_off_the_best_lineage():
    a = _archive()
    a.complete(actions=[1, 1, 2], return_=1.0, length=3, progress=2.0, cell="a")
    a.visit("b", actions=[3], return_=0.5, length=1, progress=0.0, state=b"s2", parent="root")
    a.visit("c", actions=[0], return_=0.2, length=1, progress=0.0, state=b"s3", parent="root")
    assert list(a.cells) == ["root", "a", "b"]  # "c" (0.2) went: root and a are on the lineage
    assert a.lineage() == ["a", "root"]
    assert a.program() == ([1, 1, 2], True)


def test_round_trip_and_a_missing_blob_is_refused():
    a = _archive()
    b = Archive.from_json(a.to_json(), dict(a.blobs), where="archive.json")
    assert b.to_json() == a.to_json() and b.blobs == a.blobs
    with pytest.raises(IntegrityError, match="archive.json: cell a names provider state"):
        Archive.from_json(a.to_json(), {k: v for k, v in a.blobs.items() if v != b"s1"}, where="archive.json")


def test_cell_functions():
    cells = SignalCells(names=("x", "y"), bins={"x": 2.0})
    assert cells.key({"x": 5.0, "y": 3}) == "x=2;y=3"
    assert cells.key({"x": None, "y": float("nan")}) == "x=nan;y=nan"
    frames = FrameCells(width=2, height=2, levels=2)
    dark = np.zeros((4, 8, 8), dtype=np.uint8)
    light = dark.copy()
    light[-1, :4, :4] = 255  # one quarter of the newest frame turns white
    assert frames.key({}, dark) != frames.key({}, light)
    light[0] = 255  # older frames of the stack do not count
    assert frames.key({}, dark) == frames.key({}, np.concatenate([np.full((3, 8, 8), 255, np.uint8), dark[-1:]]))
    assert count_runs([1, 1, 2, 1]) == 3 and count_runs([]) == 0

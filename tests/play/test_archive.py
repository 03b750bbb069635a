"""A search run's archive in the player: the archive page, a cell's replay, refusals, and the page in
a real browser (cells on grids, the best lineage, a click that replays the program to that cell).

The run is ``gradlab__keydoor/go-explore`` trained by the real learner for 8,192 steps (a few
seconds), so its archive has a solved lineage through the key and the door."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gradlab.checkpoints import list_checkpoints
from gradlab.errors import ContractViolation, IntegrityError, NotFound
from gradlab.explore.cells import SignalCells
from gradlab.play.archive import archive_page, cell_program
from gradlab.play.session import PlaybackSession
from tests.browser import open_page, screenshot
from tests.play.conftest import running_player

RUN_ID = "gradlab-20260101T000000-00000e1e"


@pytest.fixture(scope="module")
def search_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    """(run directory, its last checkpoint, the run spec JSON) of a solved key-door search."""
    return _search(tmp_path_factory, "gradlab__keydoor/go-explore", ["train.timesteps=8192", "train.checkpoint_freq=4096"],
                   RUN_ID)


def _search(tmp_path_factory: pytest.TempPathFactory, ref: str, overrides: list[str], run_id: str) -> tuple[Path, Path, dict]:
    """Train ``ref`` with the real learner in a fresh run directory: (it, its last checkpoint, the spec JSON)."""
    from gradlab.contracts.experiments import Experiments
    from gradlab.contracts.run_spec import RunSpec
    from gradlab.learn.learner import run_learner

    spec = RunSpec.from_resolved(Experiments().resolve(ref, overrides), seed=0, run_id=run_id)
    run_dir = tmp_path_factory.mktemp("search_runs") / run_id
    run_dir.mkdir()
    (run_dir / "spec.json").write_text(json.dumps(spec.to_json()))
    run_learner(spec, run_dir, watch_parent=False)
    return run_dir, list_checkpoints(run_dir)[-1], spec.to_json()


def _key(signals: dict) -> str:
    return SignalCells(names=("x", "y", "has_key"), bins={}).key(signals)


def test_the_archive_page_lists_every_cell_with_coordinates_counts_and_the_best_lineage(search_run) -> None:
    _, ckpt, spec = search_run
    archived = json.loads((ckpt / "resume" / "archive.json").read_text())
    page = archive_page(RUN_ID, 8192, ckpt, spec)
    assert (page.cell_kind, page.coordinates) == ("signals", ["x", "y", "has_key"])
    assert page.cell_count == len(archived["cells"]) == len(page.cells) and page.cells_left_out == 0
    assert page.visit_count == archived["counters"]["visit"] and page.selection_count == archived["counters"]["selection"]
    by_key = {c.key: c for c in page.cells}
    for c in page.cells:  # coordinates are the key's binned signals
        assert _key({k: float(v) for k, v in c.coordinates.items()}) == c.key
    returns = [c.return_ for c in page.cells]
    assert returns == sorted(returns, reverse=True)  # best first
    # The lineage runs from a start cell (no parent) through parents to the best trajectory's cell.
    assert page.best is not None and page.lineage[-1] == page.best.cell
    assert by_key[page.lineage[0]].parent is None
    for parent, child in zip(page.lineage, page.lineage[1:], strict=False):
        assert by_key[child].parent == parent
    assert {c.key for c in page.cells if c.lineage} == set(page.lineage)
    assert by_key[page.best.cell].coordinates["has_key"] == 1  # the solved lineage went through the key
    wire = json.loads(page.model_dump_json(by_alias=True))
    assert wire["cells"][0]["return"] == page.cells[0].return_ and "actions" not in wire["cells"][0]


def test_a_cell_replay_follows_its_program_to_that_cell(search_run) -> None:
    _, ckpt, spec = search_run
    page = archive_page(RUN_ID, 8192, ckpt, spec)
    for cell in (page.cells[len(page.cells) // 2], next(c for c in page.cells if c.key == page.best.cell)):
        session = PlaybackSession(ckpt, spec, seed=0, cell=cell.key)
        try:
            first = session.reset(0)
            assert first.value is None and sum(first.probs) == 1.0  # a program: no value, one action
            program = cell_program(ckpt, cell.key)
            assert len(program) == cell.length
            for t in range(cell.length):
                step = session.step()
                assert step.action == program[t] and step.probs[program[t]] == 1.0
            assert _key(step.signals) == cell.key
            assert step.episode_return == pytest.approx(cell.return_)
        finally:
            session.close()


def test_the_checkpoints_own_program_plays_to_success(search_run) -> None:
    _, ckpt, spec = search_run
    session = PlaybackSession(ckpt, spec, seed=0)
    try:
        assert session.program is not None and session.gamma == 1.0
        session.reset(0)
        for _ in range(len(session.program)):
            step = session.step()
        assert step.episode is not None and step.episode["outcome"] == "success"
        assert step.episode["length"] == len(session.program) and step.episode["values"][0] is None
    finally:
        session.close()


def test_a_tampered_archive_an_unknown_cell_and_a_checkpoint_without_one_are_refused(
        search_run, bandit_checkpoints, tmp_path: Path) -> None:
    _, ckpt, spec = search_run
    with pytest.raises(NotFound, match="no cell 'x=99;y=99;has_key=0' in its archive"):
        PlaybackSession(ckpt, spec, cell="x=99;y=99;has_key=0")
    bandit_dir, bandit = bandit_checkpoints
    bandit_spec = json.loads((bandit_dir / "spec.json").read_text())
    with pytest.raises(NotFound, match="no archive"):
        archive_page("bandit", 1, bandit[-1], bandit_spec)
    with pytest.raises(ContractViolation, match="only a search checkpoint's archive"):
        PlaybackSession(bandit[-1], bandit_spec, cell="x=1;y=1;has_key=0")
    bad = tmp_path / ckpt.name
    shutil.copytree(ckpt, bad)
    path = bad / "resume" / "archive.json"
    path.write_text(path.read_text().replace('"visits": ', '"visits": 1', 1))
    with pytest.raises(IntegrityError, match=r"archive\.json: (size|sha256) expected"):
        archive_page(RUN_ID, 8192, bad, spec)
    with pytest.raises(IntegrityError, match=r"archive\.json"):
        PlaybackSession(bad, spec, cell=json.loads(path.read_text())["cells"][0]["key"])



def _rehashed(ckpt: Path, tmp_path: Path, name: str, edit, file: str = "archive.json") -> Path:
    """A copy of ``ckpt`` whose ``resume/<file>`` ``edit`` changed, with the manifest rewritten to
    match (a writer that hashes what it breaks: the contents must be checked, not only the hash)."""
    import hashlib

    bad = tmp_path / name / ckpt.name
    shutil.copytree(ckpt, bad)
    path = bad / "resume" / file
    archive = json.loads(path.read_text())
    edit(archive)
    data = json.dumps(archive).encode()
    path.write_bytes(data)
    manifest = json.loads((bad / "manifest.json").read_text())
    manifest["files"][f"resume/{file}"] = {"sha256": hashlib.sha256(data).hexdigest(), "size_bytes": len(data)}
    (bad / "manifest.json").write_text(json.dumps(manifest))
    return bad


@pytest.mark.parametrize(("name", "edit", "where"), [
    ("no-key", lambda a: a["cells"][0].pop("key"), r"cells\.0\.key: Field required"),
    ("text-return", lambda a: a["cells"][1].update(return_="high"), r"cells\.1\.return_: Input should be a valid number"),
    ("nan-return", lambda a: a["cells"][1].update(return_=float("nan")), r"cells\.1\.return_: Input should be a finite number"),
    ("null-cell", lambda a: a["cells"].__setitem__(2, None), r"cells\.2: Input should be a valid dictionary"),
    ("huge-action", lambda a: a["cells"][0]["actions"].append(10**30), r"cells\.0\.actions\.\d+: Input should be less than"),
    ("bool-action", lambda a: a["cells"][0].update(actions=[True]), r"cells\.0\.actions\.0: Input should be a valid integer"),
    ("bad-counters", lambda a: a.update(counters="x"), r"counters: Input should be a valid dictionary"),
    ("twice", lambda a: a["cells"].append(dict(a["cells"][0])), r"cell .* is listed twice"),
])
def test_a_rehashed_archive_with_broken_contents_is_refused_naming_the_key(search_run, tmp_path, name, edit, where):
    _, ckpt, spec = search_run
    bad = _rehashed(ckpt, tmp_path, name, edit)
    with pytest.raises(IntegrityError, match=rf"archive\.json: {where}"):
        archive_page(RUN_ID, 8192, bad, spec)


def test_a_cell_program_with_an_action_past_the_goals_is_refused(search_run, tmp_path: Path) -> None:
    _, ckpt, spec = search_run
    bad = _rehashed(ckpt, tmp_path, "out-of-range", lambda a: a["cells"][0].update(actions=[0, 7]))
    key = json.loads((bad / "resume" / "archive.json").read_text())["cells"][0]["key"]
    with pytest.raises(IntegrityError, match=rf"cell '{re.escape(key)}': action 7 in its program, the goal has 4 actions"):
        PlaybackSession(bad, spec, cell=key)


@contextlib.contextmanager
def player_of(run: tuple[Path, Path, dict], run_id: str, gradlab_home: Path) -> Iterator[tuple[Any, int]]:
    """A running player whose catalog has ``run`` (copied under ``gradlab_home``) with its checkpoint
    pinned: (the player, the checkpoint's step)."""
    from gradlab.checkpoints.resolve import resolve_checkpoint

    run_dir, ckpt, _ = run
    shutil.copytree(run_dir, gradlab_home / "runs" / run_id)
    step = int(json.loads((ckpt / "manifest.json").read_text())["step"])
    with running_player() as player:
        player.config.catalog.pin(resolve_checkpoint(f"{run_id}:{step}"))
        yield player, step


@pytest.mark.slow
@pytest.mark.browser
def test_the_player_shows_the_archive_and_a_click_replays_a_cell(search_run, gradlab_home: Path) -> None:
    with player_of(search_run, RUN_ID, gradlab_home) as (player, step):
        assert player.api(f"/api/runs/{RUN_ID}/checkpoints/{step}/archive").status_code == 200
        page_json = player.api(f"/api/runs/{RUN_ID}/checkpoints/{step}/archive").json()
        lineage = page_json["lineage"]
        target = lineage[len(lineage) // 2]
        target_cell = next(c for c in page_json["cells"] if c["key"] == target)
        player.config.prestart()
        with open_page() as page:
            page.goto(f"{player.base}/runs/{RUN_ID}/checkpoints/{step}?fps=60#token={player.token}")
            page.wait_for_function("() => document.querySelectorAll('#archive rect.cell').length > 0", timeout=120_000)
            rects = page.locator("#archive rect.cell")
            assert rects.count() == page_json["cell_count"]
            assert page.locator("#archive rect.lineage").count() == len(lineage)
            assert page.locator("#archive figure.archive-grid").count() == 2  # has_key=0 and has_key=1
            assert page.locator("#archive table.data tbody tr").count() == page_json["cell_count"]
            # The checkpoint's own program plays: the status names it, the episode succeeds.
            page.wait_for_function("() => /action program of \\d+ steps/.test((document.querySelector('#status')?.textContent || ''))",
                                   timeout=120_000)
            screenshot(page, "play-archive-1-cells-and-lineage")

            page.locator(f"#archive rect.cell[data-key='{target}']").click()
            page.wait_for_function("(k) => new URLSearchParams(location.search).get('cell') === k", arg=target,
                                   timeout=60_000)
            page.wait_for_function("() => window.gradlab && window.gradlab.state.reachedCell", timeout=120_000)
            reached = page.evaluate("() => window.gradlab.state.reachedCell")
            assert _key(reached) == target
            assert f"to cell {target}" in page.locator("#status").inner_text()
            assert target in page.locator("#replaying").inner_text()
            # The archive loads beside playback: its red outline may come after the replay ends.
            page.wait_for_function("(k) => document.querySelectorAll(`#archive rect.replaying[data-key='${k}']`).length === 1",
                                   arg=target, timeout=60_000)
            assert int(page.locator("#panel-game").get_attribute("data-t")) >= target_cell["length"]
            # The reward panel draws a program's steps too (it has no value, only actions).
            # (charts redraw at most every 100 ms while playing: wait for the redraw after the pause)
            page.wait_for_function("(n) => Number(document.querySelector('#panel-reward')?.dataset.points || 0) >= n",
                                   arg=target_cell["length"], timeout=60_000)
            screenshot(page, "play-archive-2-cell-replayed")

            # "play it": back to the checkpoint's own program (the best trajectory, no ?cell).
            page.click("#play-best")
            page.wait_for_function("() => !new URLSearchParams(location.search).has('cell') && "
                                   "/action program of \\d+ steps \\(/.test((document.querySelector('#status')?.textContent || ''))",
                                   timeout=120_000)

        # An unknown cell: a readable error, nothing left that claims to play.
        with open_page() as page:
            page.goto(f"{player.base}/runs/{RUN_ID}/checkpoints/{step}?cell=x%3D99%3By%3D99#token={player.token}")
            page.wait_for_function("() => (document.querySelector('#error')?.textContent || '').includes(\"no cell 'x=99;y=99'\")",
                                   timeout=120_000)
            assert page.locator("#play").is_disabled() and page.locator("#step1").is_disabled()
            page.wait_for_function("() => document.querySelector('#archive')", timeout=60_000)  # the archive loaded
            assert page.locator("#replaying").count() == 0  # nothing claims to replay
            screenshot(page, "play-archive-3-unknown-cell")


# -- frame cells: each cell's picture ---------------------------------------------------------------
FRAME_RUN_ID = "gradlab-20260101T000000-00000f4a"


@pytest.fixture(scope="module")
def frame_search_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    """(run directory, its checkpoint, the run spec JSON) of Go-Explore on Montezuma's Revenge with
    the paper's frame cells, 4,096 steps by the real learner (a few seconds)."""
    return _search(tmp_path_factory, "MontezumaRevenge-Atari2600-v0/go-explore",
                   ["train.timesteps=4096", "train.checkpoint_freq=4096"], FRAME_RUN_ID)


def test_every_frame_cell_has_the_picture_its_key_hashes(frame_search_run) -> None:
    from gradlab.explore.cells import decode_thumbnail, key_of_small

    _, ckpt, spec = frame_search_run
    page = archive_page(FRAME_RUN_ID, 4096, ckpt, spec)
    assert (page.cell_kind, page.coordinates, page.thumbnail_size) == ("frame", [], [11, 8, 8])
    assert page.cell_count > 20 and len(page.cells) == page.cell_count
    pictures = [decode_thumbnail(c.thumbnail, 11, 8, 8) for c in page.cells]
    assert [key_of_small(p) for p in pictures] == [c.key for c in page.cells]
    assert len({p.tobytes() for p in pictures}) == page.cell_count  # distinct cells, distinct pictures
    assert all(p.max() < 8 for p in pictures) and any(p.max() > 0 for p in pictures)


@pytest.mark.parametrize(("name", "edit", "where"), [
    ("swapped", lambda a: a["cells"][1].update(thumb=a["cells"][0]["thumb"]), "the picture is not the cell's"),
    ("short", lambda a: a["cells"][1].update(thumb=a["cells"][1]["thumb"][:-1]), "expected 88 hex digits"),
    ("past-levels", lambda a: a["cells"][1].update(thumb="9" * 88), "a pixel at 9, past the 8 grey levels"),
    ("not-hex", lambda a: a["cells"][1].update(thumb="z" * 88), "not hex digits"),
])
def test_a_frame_cells_picture_that_is_not_its_own_is_refused_naming_the_cell(frame_search_run, tmp_path, name,
                                                                             edit, where) -> None:
    _, ckpt, spec = frame_search_run
    bad = _rehashed(ckpt, tmp_path, name, edit)
    key = json.loads((bad / "resume" / "archive.json").read_text())["cells"][1]["key"]
    with pytest.raises(IntegrityError, match=rf"archive\.json: cell {key}: thumb: {where}"):
        archive_page(FRAME_RUN_ID, 4096, bad, spec)


@pytest.mark.slow
@pytest.mark.browser
def test_the_player_draws_frame_cells_as_their_pictures_and_a_click_replays_one(frame_search_run,
                                                                                gradlab_home: Path) -> None:
    with player_of(frame_search_run, FRAME_RUN_ID, gradlab_home) as (player, step):
        page_json = player.api(f"/api/runs/{FRAME_RUN_ID}/checkpoints/{step}/archive").json()
        target = page_json["cells"][len(page_json["cells"]) // 2]["key"]
        player.config.prestart()
        with open_page() as page:
            page.goto(f"{player.base}/runs/{FRAME_RUN_ID}/checkpoints/{step}?fps=60#token={player.token}")
            page.wait_for_function("() => document.querySelectorAll('#archive canvas.thumb').length > 0", timeout=120_000)
            assert page.locator("#archive canvas.thumb").count() == page_json["cell_count"]
            assert page.locator("#archive rect.cell").count() == 0  # no grid: frame cells have no coordinates
            # Each canvas holds its cell's picture: the pixels drawn, read back, are the thumbnail's.
            drawn = page.evaluate("""(k) => { const c = document.querySelector(`#archive canvas.thumb[data-key='${k}']`);
                const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
                return Array.from({length: c.width * c.height}, (_, i) => d[i * 4]); }""", target)
            thumb = next(c["thumbnail"] for c in page_json["cells"] if c["key"] == target)
            assert drawn == [round(int(d, 16) * 255 / 7) for d in thumb]
            screenshot(page, "play-archive-4-frame-cells")

            page.locator(f"#archive canvas.thumb[data-key='{target}']").click()
            page.wait_for_function("(k) => new URLSearchParams(location.search).get('cell') === k", arg=target,
                                   timeout=60_000)
            page.wait_for_function("(k) => (document.querySelector('#status')?.textContent || '').includes(`to cell ${k}`)",
                                   arg=target, timeout=120_000)
            page.wait_for_function("(k) => document.querySelectorAll(`#archive canvas.replaying[data-key='${k}']`).length === 1",
                                   arg=target, timeout=60_000)
            screenshot(page, "play-archive-5-frame-cell-replayed")

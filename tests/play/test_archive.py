"""A search run's archive in the player: the archive page, a cell's replay, refusals, and the page in
a real browser (cells on grids, the best lineage, a click that replays the program to that cell).

The run is ``gradlab__keydoor/go-explore`` trained by the real learner for 8,192 steps (a few
seconds), so its archive has a solved lineage through the key and the door."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

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
    from gradlab.contracts.experiments import Experiments
    from gradlab.contracts.run_spec import RunSpec
    from gradlab.learn.learner import run_learner

    resolved = Experiments().resolve("gradlab__keydoor/go-explore", ["train.timesteps=8192", "train.checkpoint_freq=4096"])
    spec = RunSpec.from_resolved(resolved, seed=0, run_id=RUN_ID)
    run_dir = tmp_path_factory.mktemp("search_runs") / RUN_ID
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



def _rehashed(ckpt: Path, tmp_path: Path, name: str, edit) -> Path:
    """A copy of ``ckpt`` whose archive.json ``edit`` changed, with the manifest rewritten to match
    (a writer that hashes what it breaks: the contents must be checked, not only the hash)."""
    import hashlib

    bad = tmp_path / name / ckpt.name
    shutil.copytree(ckpt, bad)
    path = bad / "resume" / "archive.json"
    archive = json.loads(path.read_text())
    edit(archive)
    data = json.dumps(archive).encode()
    path.write_bytes(data)
    manifest = json.loads((bad / "manifest.json").read_text())
    manifest["files"]["resume/archive.json"] = {"sha256": hashlib.sha256(data).hexdigest(), "size_bytes": len(data)}
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


@pytest.mark.slow
@pytest.mark.browser
def test_the_player_shows_the_archive_and_a_click_replays_a_cell(search_run, gradlab_home: Path) -> None:
    from gradlab.checkpoints.resolve import resolve_checkpoint

    run_dir, ckpt, spec = search_run
    shutil.copytree(run_dir, gradlab_home / "runs" / RUN_ID)
    step = int(json.loads((ckpt / "manifest.json").read_text())["step"])
    with running_player() as player:
        player.config.catalog.pin(resolve_checkpoint(f"{RUN_ID}:{step}"))
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

"""A JERK checkpoint's retained sequences in the player: the page, a sequence's replay reaching its
recorded score, refusals, and the page in a real browser (bars and a table; a click replays one).

The run is ``gradlab__keydoor/jerk`` trained by the real learner for 8,192 steps (seconds); the
maze is deterministic, so a sequence replayed from reset scores what JERK recorded for it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from gradlab.errors import IntegrityError, NotFound
from gradlab.play.archive import cell_program, read_sequences, sequences_page
from gradlab.play.session import PlaybackSession
from tests.browser import open_page, screenshot
from tests.play.test_archive import _rehashed, _search, player_of

RUN_ID = "gradlab-20260101T000000-0000e12c"


@pytest.fixture(scope="module")
def jerk_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    return _search(tmp_path_factory, "gradlab__keydoor/jerk", ["train.timesteps=8192", "train.checkpoint_freq=8192"],
                   RUN_ID)


def test_the_sequences_page_ranks_them_as_jerk_does_and_the_best_is_the_program(jerk_run) -> None:
    _, ckpt, _ = jerk_run
    page = sequences_page(RUN_ID, 8192, ckpt)
    state = json.loads((ckpt / "resume" / "search.json").read_text())
    assert page.sequence_count == len(state["retained"]) == len(page.sequences) > 3
    means = [q.return_mean for q in page.sequences]
    assert means == sorted(means, reverse=True) and [q.rank for q in page.sequences] == list(range(1, len(means) + 1))
    assert [q.key for q in page.sequences] == [f"sequence:{q.rank}" for q in page.sequences]
    by_actions = {tuple(s["actions"]): s["returns"] for s in state["retained"]}
    for q, stored in zip(page.sequences, read_sequences(ckpt), strict=True):
        returns = by_actions[tuple(stored["actions"])]
        assert (q.length, q.replays) == (len(stored["actions"]), len(returns))
        assert (q.return_mean, q.return_last, q.return_best) == (pytest.approx(np.mean(returns)), returns[-1], max(returns))
    assert any(q.replays > 1 for q in page.sequences)  # JERK replayed its best ones
    from gradlab.checkpoints import load_policy

    program = load_policy(ckpt).actions  # the checkpoint's own program (verified)
    assert cell_program(ckpt, "sequence:1") == program.tolist()
    assert page.sequences[0].return_mean == json.loads((ckpt / "policy_spec.json").read_text())["return"]


def test_a_sequence_replay_reaches_the_score_jerk_recorded(jerk_run) -> None:
    _, ckpt, spec = jerk_run
    page = sequences_page(RUN_ID, 8192, ckpt)
    for q in (page.sequences[1], page.sequences[-1]):
        session = PlaybackSession(ckpt, spec, seed=0, cell=q.key)
        try:
            session.reset(0)
            program = cell_program(ckpt, q.key)
            for t in range(q.length):
                step = session.step()
                assert step.action == program[t] and step.probs[program[t]] == 1.0
            assert step.episode_return == pytest.approx(q.return_last)  # deterministic: every scoring alike
            assert q.return_best == pytest.approx(q.return_mean)
        finally:
            session.close()


def test_an_unknown_sequence_a_tampered_state_and_a_checkpoint_without_sequences_are_refused(
        jerk_run, bandit_checkpoints, tmp_path: Path) -> None:
    _, ckpt, spec = jerk_run
    n = sequences_page(RUN_ID, 8192, ckpt).sequence_count
    with pytest.raises(NotFound, match=rf"no retained sequence 'sequence:999' \({n} retained\)"):
        PlaybackSession(ckpt, spec, cell="sequence:999")
    _, bandit = bandit_checkpoints
    with pytest.raises(NotFound, match="no retained sequences .* only gradlab.jerk checkpoints keep one"):
        sequences_page("bandit", 1, bandit[-1])
    bad = tmp_path / ckpt.name
    shutil.copytree(ckpt, bad)
    path = bad / "resume" / "search.json"
    path.write_text(path.read_text().replace('"returns": [', '"returns": [1, ', 1))
    with pytest.raises(IntegrityError, match=r"search\.json: (size|sha256) expected"):
        sequences_page(RUN_ID, 8192, bad)


@pytest.mark.parametrize(("name", "edit", "where"), [
    ("no-returns", lambda s: s["retained"][0].update(returns=[]), r"retained\.0\.returns: List should have at least 1 item"),
    ("nan-score", lambda s: s["retained"][1].update(returns=[float("nan")]), r"retained\.1\.returns\.0: Input should be a finite number"),
    ("negative-action", lambda s: s["retained"][0]["actions"].append(-1), r"retained\.0\.actions\.\d+: Input should be greater"),
    ("old-format", lambda s: s.update(format="gradlab.jerk/1"), r"expected a JERK search state of format gradlab\.jerk/2"),
])
def test_a_rehashed_search_state_with_broken_contents_is_refused_naming_the_key(jerk_run, tmp_path, name, edit, where):
    _, ckpt, _ = jerk_run
    bad = _rehashed(ckpt, tmp_path, name, edit, "search.json")
    with pytest.raises(IntegrityError, match=rf"search\.json: {where}"):
        sequences_page(RUN_ID, 8192, bad)


@pytest.mark.slow
@pytest.mark.browser
def test_the_player_shows_retained_sequences_and_a_click_replays_one(jerk_run, gradlab_home: Path) -> None:
    with player_of(jerk_run, RUN_ID, gradlab_home) as (player, step):
        assert player.api(f"/api/runs/{RUN_ID}/checkpoints/{step}").json()["sequences"] is True
        page_json = player.api(f"/api/runs/{RUN_ID}/checkpoints/{step}/sequences").json()
        assert player.api(f"/api/runs/{RUN_ID}/checkpoints/{step}/archive").status_code == 404
        target = page_json["sequences"][1]
        player.config.prestart()
        with open_page() as page:
            page.goto(f"{player.base}/runs/{RUN_ID}/checkpoints/{step}?fps=60#token={player.token}")
            page.wait_for_function("() => document.querySelectorAll('#sequences rect.sequence').length > 0", timeout=120_000)
            assert page.locator("#sequences rect.sequence").count() == min(100, page_json["sequence_count"])
            assert page.locator("#sequences rect.best").count() == 1
            assert page.locator("#sequences table.data tbody tr").count() == page_json["sequence_count"]
            page.wait_for_function("() => /action program of \\d+ steps \\(/.test((document.querySelector('#status')?.textContent || ''))",
                                   timeout=120_000)
            screenshot(page, "play-sequences-1-bars-and-table")

            page.locator(f"#sequences rect.sequence[data-key='{target['key']}']").click()
            page.wait_for_function("(k) => new URLSearchParams(location.search).get('cell') === k", arg=target["key"],
                                   timeout=60_000)
            page.wait_for_function("() => (document.querySelector('#status')?.textContent || '').includes(': retained sequence 2')",
                                   timeout=120_000)
            assert page.locator("#replaying").inner_text() == "Replaying retained sequence 2."
            page.wait_for_function("() => document.querySelectorAll('#sequences rect.replaying[data-key=\"sequence:2\"]').length === 1",
                                   timeout=60_000)
            # the replay pauses where the sequence ends
            page.wait_for_function("(n) => Number(document.querySelector('#panel-game')?.dataset.t || 0) >= n",
                                   arg=target["length"], timeout=120_000)
            screenshot(page, "play-sequences-2-sequence-replayed")

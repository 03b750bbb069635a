"""Curves and reports read sealed runs' journals through the journal's API, read-only, with the outbox
identity each attempt recorded: finished runs draw, truncation is caught, nothing is rewritten.

The runs are synthetic (gradlab.benchmarks.reports.synthesize: real receipt models, file stores, and
journals written by the journal's own writer with an outbox identity, as the supervisor writes them).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gradlab.benchmarks.reports import synthesize
from gradlab.errors import ContractViolation, NotFound

GOAL = "gradlab__bandit"


@pytest.fixture
def sealed(gradlab_home: Path):
    """(settings, stores, run ids): 2 sealed runs of 8 journal lines each (5 training, 3 evaluation)."""
    from gradlab.settings import load_settings
    from gradlab.stores import open_stores

    ids = synthesize(gradlab_home, runs=2, rollouts=5)
    return load_settings(), open_stores(), ids


def _journal(settings, run_id: str) -> Path:
    return settings.run_dir(run_id) / "journal.jsonl"


def _oracle(path: Path, metric: str, axis: str) -> list[tuple[float, float]]:
    """The test's own reading of the JSON lines."""
    rows = [json.loads(line)["metrics"] for line in path.read_text().splitlines()]
    return [(float(m[axis]), float(m[metric])) for m in rows if metric in m and axis in m]


def test_a_finished_run_draws_with_its_attempts_outbox_identity(sealed) -> None:
    from gradlab.results.curves import open_journal, run_curves

    settings, stores, (run_id, _) = sealed
    path = _journal(settings, run_id)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 8 and {line["outbox"] for line in lines} == {"outbox-00000000"}
    assert open_journal(settings, stores, run_id).high_water == 8  # the receipt's sinks.journal
    (train, ev) = run_curves(settings, stores, [run_id], ["train/episode/return/shaped/mean", "eval/episode/return/mean"])
    assert list(zip(train.x, train.y, strict=True)) == _oracle(path, "train/episode/return/shaped/mean", "train/global_step")
    assert list(zip(ev.x, ev.y, strict=True)) == _oracle(path, "eval/episode/return/mean", "eval/checkpoint_step")


@pytest.mark.parametrize("keep", [2, 0])
def test_a_cut_or_empty_journal_is_refused_naming_run_file_and_counts(sealed, keep: int) -> None:
    from gradlab.results.curves import run_curves

    settings, stores, (run_id, _) = sealed
    path = _journal(settings, run_id)
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:keep]))
    held = "events up to 2" if keep else "no events"
    with pytest.raises(ContractViolation, match=rf"run {run_id}: metric journal {path} is truncated: it holds {held} "
                                                r"of outbox outbox-00000000, the terminal receipt of attempt-001 says "
                                                r"events up to 8 were delivered"):
        run_curves(settings, stores, [run_id])


def test_readers_never_modify_the_journal_and_leave_a_torn_line_out(sealed) -> None:
    from gradlab.metrics.journal import Journal
    from gradlab.results.curves import run_curves

    settings, stores, (run_id, _) = sealed
    path = _journal(settings, run_id)
    torn = path.read_bytes() + b'{"event_seq": 9, "metr'
    path.write_bytes(torn)
    curves = run_curves(settings, stores, [run_id], ["train/episode/return/shaped/mean"])
    assert len(curves[0].x) == 5
    assert path.read_bytes() == torn  # the reader cut nothing
    reader = Journal(path, outbox="outbox-00000000", readonly=True)
    assert reader.high_water == 8 and len(reader.read_all()) == 8 and path.read_bytes() == torn
    with pytest.raises(ContractViolation, match="opened read-only"):
        reader.write(10, {"x": 1})
    missing = path.parent / "none" / "journal.jsonl"
    with pytest.raises(FileNotFoundError):
        Journal(missing, readonly=True)
    assert not missing.parent.exists()  # a read-only open creates nothing
    # The writer keeps its repair: it cuts the torn line and continues after it.
    writer = Journal(path, outbox="outbox-00000000")
    assert writer.high_water == 8 and path.read_bytes() == torn[: torn.rindex(b"\n") + 1]


def test_the_report_leaves_a_truncated_journal_out_with_a_note_and_no_local_path(sealed, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from gradlab.cli.app import app
    from gradlab.results.reports import build_site

    settings, stores, (run_id, other) = sealed
    path = _journal(settings, run_id)
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:2]))
    before = path.read_bytes()
    site = build_site(settings, stores, tmp_path / "site")
    page = (tmp_path / "site" / "smoke" / f"{GOAL}.html").read_text()
    (note,) = site.notes
    assert note.startswith(f"run {run_id}: metric journal journal.jsonl is truncated: it holds events up to 2")
    assert f"left out: {note}" in page and str(settings.home) not in page and str(tmp_path) not in page
    assert path.read_bytes() == before
    out = CliRunner().invoke(app, ["reports", "build", "--out", str(tmp_path / "cli"), "--json"])
    assert out.exit_code == 0, out.stderr
    assert json.loads(out.stdout)["left_out"] == [note] and f"warning: left out: run {run_id}" in out.stderr


def test_report_and_sync_bad_paths_are_one_error_line(sealed, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from gradlab.cli.app import app

    a_file = tmp_path / "a-file"
    a_file.write_text("keep me")
    out = CliRunner().invoke(app, ["reports", "build", "--out", str(a_file)])
    assert out.exit_code == 1 and not isinstance(out.exception, OSError)
    assert f"--out {a_file}: expected a folder for the site, found a file" in out.stderr.replace("\n", "")
    assert a_file.read_text() == "keep me"
    out = CliRunner().invoke(app, ["reports", "sync", "--store", "file:///proc/nope"])
    assert out.exit_code == 1 and not isinstance(out.exception, OSError), out.exception
    assert out.stderr.startswith("error:") and "file:///proc/nope" in out.stderr


def test_curves_default_figure_goes_under_the_home_and_says_where(sealed, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from gradlab.cli.app import app

    settings, _, (run_id, other) = sealed
    monkeypatch.chdir(tmp_path)
    out = CliRunner().invoke(app, ["runs", "curves", run_id, other])
    assert out.exit_code == 0, out.stderr
    target = settings.home / "curves" / f"{run_id}+{other}.png"  # as the README says
    assert target.read_bytes()[:4] == b"\x89PNG" and str(target) in out.stderr.replace("\n", "")
    assert list(tmp_path.iterdir()) == []  # nothing in the current folder


def test_an_unknown_metric_names_the_close_registered_ones(sealed) -> None:
    from gradlab.results.curves import check_metrics

    with pytest.raises(ContractViolation) as e:
        check_metrics(["train/episode/retrun/shaped/mean"])
    assert "metric 'train/episode/retrun/shaped/mean' is not registered; did you mean" in str(e.value)
    assert "train/episode/return/shaped/mean" in str(e.value) and "METRICS.md" not in str(e.value)
    with pytest.raises(NotFound):
        from gradlab.results.curves import open_journal

        open_journal(sealed[0], sealed[1], "gradlab-20260101T000000-deadbeef")

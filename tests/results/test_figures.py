"""Figures a researcher would show: labelled axes with units, a readable range for one point, an
empty panel that says why, counts in the right number, baselines labelled by how they act."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gradlab.results.curves import Curve, empty_reasons, plot_curves, run_curves


@pytest.fixture
def sealed(gradlab_home: Path):
    from gradlab.benchmarks.reports import synthesize
    from gradlab.settings import load_settings
    from gradlab.stores import open_stores

    return load_settings(), open_stores(), synthesize(gradlab_home, runs=1, rollouts=5)


def _panels(fig) -> list:
    return [ax for ax in fig.axes if ax.get_visible()]


def test_every_panel_names_its_axes_with_units(sealed) -> None:
    settings, stores, (run_id,) = sealed
    fig = plot_curves(run_curves(settings, stores, [run_id]))
    panels = _panels(fig)
    assert len(panels) >= 4
    for ax in panels:
        assert ax.get_xlabel().startswith("env steps") or ax.get_xlabel() == "learner wall time (s)", ax.get_xlabel()
        assert ax.get_xlabel().endswith(")") and ax.get_ylabel().endswith(")"), (ax.get_title(), ax.get_ylabel())
    labels = {ax.get_title(): ax.get_ylabel() for ax in panels}
    assert labels["train/throughput/loop_fps"] == "throughput/loop_fps (steps/s)"
    assert labels["eval/episode/return/mean"] == "return/mean (reward)"
    seconds = plot_curves(run_curves(settings, stores, [run_id], x="seconds"))
    assert {ax.get_xlabel() for ax in _panels(seconds)} == {"learner wall time (s)"}


def test_a_single_evaluation_point_gets_a_readable_range() -> None:
    one = Curve(run_id="r", metric="eval/episode/return/mean", x_axis="eval/checkpoint_step", x=(16384.0,), y=(500.0,),
                low=(500.0,), high=(500.0,), band="95% interval of the mean (normal approximation)")
    (ax,) = _panels(plot_curves([one]))
    assert ax.get_xlim() == (0.0, 20480.0)  # from 0 to 125% of the step, not 16384 ± 0.0005
    assert ax.get_ylim() == (450.0, 550.0)


def test_an_empty_panel_says_why(gradlab_home: Path) -> None:
    from gradlab.contracts import Experiments
    from gradlab.contracts.run_spec import RunSpec
    from gradlab.metrics.journal import Journal
    from gradlab.receipts import open_run
    from gradlab.runs.paths import RunPaths
    from gradlab.settings import load_settings
    from gradlab.stores import open_stores

    settings, stores = load_settings(), open_stores()
    ids = []
    for i, evaluate in enumerate((False, True)):
        spec = RunSpec.from_resolved(Experiments().resolve("gradlab__bandit/ppo"), seed=i, evaluate=evaluate,
                                     run_id=f"gradlab-20260101T000000-0000e0f{i}")
        open_run(stores, spec)
        Journal(RunPaths(settings.run_dir(spec.run_id)).journal, outbox="o", attempt="attempt-001").write_many(
            [(1, {"train/global_step": 512, "train/episode/return/shaped/mean": 0.5})])
        ids.append(spec.run_id)
    metrics = ["train/episode/return/shaped/mean", "eval/episode/return/mean"]
    for run_id, why in zip(ids, ["evaluation is off for this run (--no-eval)", "no evaluation yet"], strict=True):
        curves = run_curves(settings, stores, [run_id], metrics)
        empty = empty_reasons(stores, [run_id], metrics, curves)
        assert empty == {"eval/episode/return/mean": why}
        panel = [ax for ax in _panels(plot_curves(curves, empty=empty)) if ax.get_title() == "eval/episode/return/mean"]
        assert [t.get_text() for t in panel[0].texts] == [why]
        assert panel[0].get_ylabel() == "return/mean (reward)"


def test_counts_are_singular_or_plural_and_two_runs_name_their_figure(sealed, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from gradlab.cli.app import app
    from gradlab.results.reports import build_site

    settings, stores, (run_id,) = sealed
    build_site(settings, stores, tmp_path / "site")
    index = (tmp_path / "site" / "index.html").read_text()
    assert "(1 run)" in index and "(1 runs)" not in index
    out = CliRunner().invoke(app, ["runs", "curves", run_id, "--metric", "eval/episode/return/mean"])
    assert out.exit_code == 0, out.stderr
    assert "(1 curve, 3 points)" in out.stderr.replace("\n", " ")


def test_the_random_baseline_is_labelled_stochastic(gradlab_home: Path) -> None:
    from typer.testing import CliRunner

    from gradlab.cli.app import app

    out = CliRunner().invoke(app, ["eval", "--baseline", "random", "gradlab__bandit"])
    assert out.exit_code == 0, out.output
    episodes = next(line for line in out.stdout.splitlines() if "episodes" in line)
    assert "(stochastic)" in episodes and "deterministic" not in episodes, episodes
    noop = CliRunner().invoke(app, ["eval", "--baseline", "noop", "gradlab__bandit", "--json"])
    assert noop.exit_code == 0 and json.loads(noop.stdout)["policy"] == "deterministic"


def test_a_goal_pages_median_curve_marks_only_measured_points() -> None:
    """The median across seeds is drawn on a common grid; its markers sit only at steps some seed
    measured (two evaluations give two markers, not one per grid point)."""
    import numpy as np

    from gradlab.results.reports import _curves_figure

    def curve(run: str, xs: tuple[float, ...], ys: tuple[float, ...]) -> Curve:
        return Curve(run_id=run, metric="eval/episode/return/mean", x_axis="eval/checkpoint_step", x=xs, y=ys)

    groups = {"go-explore": [curve("a", (4096.0, 8192.0), (0.1, 1.1))],
              "ppo": [curve("b", (2048.0, 4096.0, 6144.0), (0.0, 0.5, 1.0)), curve("c", (2048.0, 6144.0), (0.2, 0.8))]}
    fig = _curves_figure("gradlab__keydoor", groups)
    eval_ax = next(ax for ax in fig.axes if ax.get_title().startswith("eval/episode/return/mean"))
    marked = {}
    for line in eval_ax.get_lines():
        x = np.asarray(line.get_xdata())
        marked[line.get_label()] = sorted(float(x[j]) for j in line.get_markevery())
    assert marked == {"go-explore (n=1)": [4096.0, 8192.0], "ppo (n=2)": [2048.0, 4096.0, 6144.0]}

"""Static HTML reports and their publication to a store (docs/ARCHITECTURE.md section 12).

``build_site`` writes ``index.html`` (projects and their goals) and one page per goal,
``<project>/<goal>.html``: the goal's contract summary, the leaders table (cohort IQM with its 95%
stratified-bootstrap interval), learning curves across seeds (median and interquartile band per
cohort), steps and wall time to acceptance per seed, the promoted checkpoints with the command
that plays them, the search runs' curves (archive cells and best progress, or JERK's retained
sequences and best return, over emulator frames), and the goal's datasets with the command that
plays their episodes (a goal with datasets and no sealed run gets a page too). Images are PNGs embedded as ``data:`` URLs and there
is no script, stylesheet or font from elsewhere: a page opens with no network. Pages carry no build time, so the same stores
and journals build the same bytes (and the same content hash).

``sync_site`` publishes a built site: every file create-only (verified) under
``reports/builds/<build sha256>/``, where the build hash is the sha256 of the site's manifest
(relative path → file sha256), then ``reports/index.json`` by compare-and-swap (``latest`` and the
list of builds). Re-syncing an unchanged site writes nothing new.
"""

from __future__ import annotations

import base64
import hashlib
import html
import io
import json
import logging
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gradlab.console import plural
from gradlab.errors import Conflict, ContractViolation, GradlabError, NotFound, PermanentError
from gradlab.results import cohorts as cohorts_mod

log = logging.getLogger(__name__)

REPORTS_PREFIX = "reports/"
INDEX_KEY = "reports/index.json"
#: Metrics drawn across seeds on each goal page.
CURVE_METRICS = ("train/episode/return/shaped/mean", "eval/episode/return/mean")
#: A search backend's curves on its goal page (archive cells and best progress, or JERK's retained
#: sequences and best return), drawn over emulator frames.
SEARCH_METRICS = {
    "gradlab.go_explore": ("train/algorithm/go_explore/archive/cell_count", "train/algorithm/go_explore/best/progress"),
    "gradlab.jerk": ("train/algorithm/jerk/retained/count", "train/algorithm/jerk/best/return_mean"),
}
_STYLE = """body{font-family:system-ui,sans-serif;margin:2rem;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:.5rem 0 1.5rem}td,th{border:1px solid #ccc;padding:.25rem .5rem;text-align:left}
th{background:#f3f3f3}code{background:#f6f6f6;padding:0 .2rem}img{max-width:100%}img.curves{width:100%;height:auto}
.note{color:#666}.warning{color:#a40}"""


@dataclass(frozen=True)
class BuiltSite:
    """What :func:`build_site` wrote: the folder, its pages (relative paths), and what each page
    left out (a run whose journal is missing, truncated or unreadable), as the pages say it."""

    root: Path
    pages: tuple[str, ...]
    goals: tuple[str, ...]
    notes: tuple[str, ...] = ()


def _e(value: object) -> str:
    return html.escape(str(value))


def _fmt(e, digits: int = 3) -> str:
    if e.value is None:
        return "-"
    if e.low is None:
        return f"{e.value:.{digits}f} <span class='note'>(interval undefined: {plural(e.n, 'seed')})</span>"
    return f"{e.value:.{digits}f} [{e.low:.{digits}f}, {e.high:.{digits}f}]"


def _page(title: str, body: str) -> str:
    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{_e(title)}</title>"
            f"<style>{_STYLE}</style></head><body>{body}</body></html>\n")


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
_DASHES = ("-", "--", "-.", ":")


def _curves_figure(goal_id: str, groups: dict[str, list], empty: dict[str, str] | None = None):
    """Median and IQR band across seeds, one line per cohort, one panel per metric; None if no points.

    Every panel has its axis labels and units; a panel without points says why (``empty``: metric ->
    reason, :func:`gradlab.results.curves.empty_reasons`); a single point gets a readable range.

    Cohorts that coincide stay distinguishable: each has its own hollow marker (of decreasing size,
    so a point drawn over another leaves a ring visible) and line style. The legend sits below the
    panels, never over a curve; the figure is wide enough to fill the page (the image is scaled to
    the page's width).
    """
    import numpy as np
    from matplotlib.figure import Figure

    from gradlab.results.curves import X_LABELS, median_band, metric_label, sensible_limits

    fig = Figure(figsize=(13, 4.2), layout="constrained")
    axes = fig.subplots(1, len(CURVE_METRICS), squeeze=False).ravel()
    drawn = False
    handles: dict[str, object] = {}
    for ax, metric in zip(axes, CURVE_METRICS, strict=True):
        xs: list[float] = []
        ys: list[float] = []
        for i, (label, curves) in enumerate(groups.items()):
            mine = [c for c in curves if c.metric == metric]
            x, med, q25, q75 = median_band(mine)
            if not x.size:
                continue
            drawn = True
            # Markers only where some seed has a measured point (the median line between them is
            # interpolated on a common grid, so a marker per grid point would show points never measured).
            measured = np.unique([v for c in mine for v in c.x if x[0] <= v <= x[-1]])
            if x.size > 1:
                grid = x
                x = np.union1d(grid, measured)
                med, q25, q75 = (np.interp(x, grid, band) for band in (med, q25, q75))
            marks = [int(j) for j in np.searchsorted(x, measured)] or [0]
            (line,) = ax.plot(x, med, marker=_MARKERS[i % len(_MARKERS)], markevery=marks,
                              markersize=max(4.0, 9.0 - 1.5 * i), markerfacecolor="none", markeredgewidth=1.2,
                              linestyle=_DASHES[i % len(_DASHES)], linewidth=1.4, color=f"C{i % 10}",
                              label=f"{label} (n={len(mine)})")
            handles.setdefault(line.get_label(), line)
            if x.size > 1:
                ax.fill_between(x, q25, q75, color=line.get_color(), alpha=0.15, linewidth=0)
            xs += list(x)
            ys += [*med, *q25, *q75]
        ax.set_title(f"{metric} (median, IQR)", fontsize=10)
        ax.set_xlabel(X_LABELS["eval/checkpoint_step" if metric.startswith("eval/") else "train/global_step"], fontsize=9)
        ax.set_ylabel(metric_label(metric), fontsize=9)
        if xs:
            sensible_limits(ax, xs, ys)
        else:
            ax.text(0.5, 0.5, (empty or {}).get(metric, "no points"), ha="center", va="center", fontsize=10,
                    color="0.35", transform=ax.transAxes)
            ax.set_xticks([])
            ax.set_yticks([])
        ax.grid(alpha=0.3)
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="outside lower center",
                   ncols=min(4, len(handles)), fontsize=9, frameon=False)
    fig.suptitle(goal_id, fontsize=11)
    return fig if drawn else None


def frames_per_step(spec: dict) -> int:
    """Emulator frames per agent step of a run spec JSON: its environment's ``frame_skip`` (1 for
    providers without one)."""
    try:
        return max(1, int((spec.get("environment") or {}).get("preprocessing", {}).get("frame_skip", 1)))
    except (TypeError, ValueError, AttributeError):
        return 1


def _search_html(settings, stores, goal_id: str, results: Sequence[cohorts_mod.SeedResult]) -> str:
    """The search runs' section of a goal page: per backend, archive size and best progress (Go-Explore)
    or retained sequences and best return (JERK) per seed over emulator frames; '' without search runs."""
    from matplotlib.figure import Figure

    from gradlab import receipts as rules
    from gradlab.results.curves import metric_label, run_curves, sensible_limits

    by_backend: dict[str, list] = defaultdict(list)
    for r in results:
        try:
            spec = rules.read_run_spec(stores, r.run_id)
        except GradlabError:  # the spec only tells a search run apart: without it the run is not one here
            continue
        backend = ((spec.get("recipe") or {}).get("train") or {}).get("backend", {}).get("id")
        if backend in SEARCH_METRICS:
            by_backend[backend].append((r, frames_per_step(spec)))
    parts = []
    for backend, runs in sorted(by_backend.items()):
        metrics = SEARCH_METRICS[backend]
        fig = Figure(figsize=(13, 3.8), layout="constrained")
        axes = fig.subplots(1, len(metrics), squeeze=False).ravel()
        skips = sorted({skip for _, skip in runs})
        drawn = False
        per_run = []
        for r, skip in runs:
            try:  # each journal read once, for both panels
                per_run.append((r, skip, run_curves(settings, stores, [r.run_id], list(metrics), relative=True)))
            except GradlabError:  # a journal that cannot be read: the learning curves' note names it
                continue
        for ax, metric in zip(axes, metrics, strict=True):
            xs: list[float] = []
            ys: list[float] = []
            for i, (r, skip, curves) in enumerate(per_run):
                for c in (c for c in curves if c.metric == metric):
                    x = [v * skip for v in c.x]
                    ax.plot(x, c.y, linestyle=_DASHES[i % len(_DASHES)], color=f"C{i % 10}", linewidth=1.4,
                            label=f"{cohorts_mod.cohort_label(r.recipe_id, r.overrides)} seed {r.seed}")
                    xs += x
                    ys += list(c.y)
            ax.set_title(metric, fontsize=10)
            ax.set_xlabel(f"emulator frames (env steps x frame skip {', '.join(map(str, skips))})", fontsize=9)
            ax.set_ylabel(metric_label(metric), fontsize=9)
            ax.grid(alpha=0.3)
            if xs:
                drawn = True
                sensible_limits(ax, xs, ys)
                ax.legend(fontsize=8, frameon=False)
        name = backend.removeprefix("gradlab.")
        parts.append(f"<h2>Search: {_e(name)}</h2>")
        parts.append(f"<img class='curves' id='search-{_e(name)}' alt='{_e(name)} search curves of {_e(goal_id)}' "
                     f"src='{_png(fig)}'>" if drawn else "<p class='note'>no search curves: no journal on this machine "
                     "holds these runs</p>")
    return "".join(parts)


def _contract_html(goal_id: str) -> str:
    try:
        goal = cohorts_mod._experiments().load_goal(goal_id)
    except GradlabError as e:
        return f"<p class='note'>contract unavailable: {_e(e)}</p>"
    env = goal.train.environment
    rules = "; ".join(f"{r.metric} {r.operator} {r.threshold:g}" for r in goal.eval.acceptance) or "none (training only)"
    rows = [("title", goal.title or goal_id), ("environment", f"{env.provider}: {env.env_id}"),
            ("objective", f"{goal.objective.direction} {goal.objective.rank}"),
            ("evaluation", f"{goal.eval.episodes} episodes, {goal.eval.policy} policy, seed {goal.eval.seed}"),
            ("acceptance", rules)]
    body = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows)
    return f"<p>{_e(goal.description)}</p><table class='contract'>{body}</table>"


def goal_page(settings, stores, goal_id: str, results: Sequence[cohorts_mod.SeedResult],
              notes: list[str] | None = None, *, datasets: Sequence | None = None) -> str:
    """The HTML of one goal's page (``datasets``: the goal's dataset manifests, listed with the command
    that plays their episodes); what it leaves out (journals missing, truncated against their
    terminal receipt, or unreadable) is said on the page, naming the run and the file relative to the
    run's directory (pages are published: no local path), and appended to ``notes``."""
    from gradlab.results.curves import run_curves

    up = "../" * (goal_id.count("/") + 1)  # a nested goal's page sits one folder deeper per family
    parts = [f"<p><a href='{up}index.html'>all goals</a></p><h1>{_e(goal_id)}</h1>", _contract_html(goal_id)]
    if not results:  # a goal with datasets and no sealed run
        parts += ["<h2>Leaders</h2><p class='note'>no sealed runs</p>", _datasets_html(datasets)]
        return _page(f"gradlab: {goal_id}", "".join(parts))
    ranked = cohorts_mod.leaders_runs(stores, goal_id, results=results)
    parts.append("<h2>Leaders</h2>")
    if ranked:
        rows = "".join(
            f"<tr><td>{i}</td><td>{_e(c.label)}</td><td>{len(c.scores)}/{len(c.seeds)}</td><td>{_fmt(c.iqm)}</td>"
            f"<td>{_fmt(c.median)}</td>"
            f"<td>{c.accepted}/{len(c.seeds)}</td><td>{_fmt(c.steps_to_acceptance, 0)}</td>"
            f"<td>{_fmt(c.seconds_to_acceptance, 1)}</td></tr>" for i, c in enumerate(ranked, start=1))
        parts.append(f"<table id='leaders'><tr><th>rank</th><th>recipe</th><th>seeds scored</th>"
                     f"<th>IQM of {_e(ranked[0].objective)} [95% CI]</th><th>median [IQR]</th><th>accepted</th>"
                     f"<th>steps to acceptance, median [IQR]</th><th>seconds to acceptance, median [IQR]</th></tr>{rows}</table>")
        parts.append(f"<p class='note' id='scoring'>scoring: {_e(cohorts_mod.SCORING_RULE)}</p>")
        parts += [f"<p class='note'>{_e(c.label)}: {_e(c.note)}</p>" for c in ranked
                  if c.not_scored or any(r.scored_by != cohorts_mod.SCORED_PROMOTED for r in c.seeds)]
    else:
        parts.append("<p class='note'>no evaluated runs</p>")
    groups: dict[str, list] = defaultdict(list)
    left_out: list[str] = []
    for r in results:
        try:
            groups[cohorts_mod.cohort_label(r.recipe_id, r.overrides)] += run_curves(
                settings, stores, [r.run_id], CURVE_METRICS, relative=True)
        except GradlabError as e:
            left_out.append(str(e))
    if notes is not None:
        notes += left_out
    parts.append("<h2>Learning curves across seeds</h2>")
    from gradlab.results.curves import empty_reasons

    empty = empty_reasons(stores, [r.run_id for r in results], CURVE_METRICS, [c for cs in groups.values() for c in cs])
    fig = _curves_figure(goal_id, groups, empty)
    parts.append(f"<img class='curves' alt='learning curves of {_e(goal_id)}' src='{_png(fig)}'>" if fig is not None
                 else "<p class='note'>no curves: no journal on this machine holds these runs</p>")
    parts.append(_search_html(settings, stores, goal_id, results))
    parts += [f"<p class='note warning'>left out: {_e(n)}</p>" for n in left_out]
    starts = sorted({name for r in results for name, _ in r.start_success})  # a goal with several starts
    parts.append("<h2>Seeds: steps and time to acceptance</h2><table id='seeds'><tr><th>recipe</th><th>seed</th>"
                 "<th>run</th><th>outcome</th><th>score</th><th>steps to acceptance</th><th>seconds to acceptance</th>"
                 + "".join(f"<th>success from {_e(s)}</th>" for s in starts) + "</tr>")
    for r in results:
        by_start = dict(r.start_success)
        parts.append(f"<tr><td>{_e(cohorts_mod.cohort_label(r.recipe_id, r.overrides))}</td><td>{r.seed}</td>"
                     f"<td>{_e(r.run_id)}</td><td>{_e(r.outcome)}</td>"
                     f"<td>{'-' if r.score is None else f'{r.score:.3f}'}</td><td>{r.steps_to_acceptance or '-'}</td>"
                     f"<td>{'-' if r.seconds_to_acceptance is None else f'{r.seconds_to_acceptance:.1f}'}</td>"
                     + "".join(f"<td>{'-' if s not in by_start else f'{by_start[s]:.3f}'}</td>" for s in starts)
                     + "</tr>")
    parts.append("</table><h2>Promoted checkpoints</h2>")
    promoted = [r for r in results if r.accepted and r.checkpoint_sha256]
    if promoted:
        parts.append("<table id='checkpoints'><tr><th>run</th><th>recipe</th><th>seed</th><th>step</th><th>sha256</th>"
                     "<th>play</th></tr>")
        parts += [f"<tr><td>{_e(r.run_id)}</td><td>{_e(cohorts_mod.cohort_label(r.recipe_id, r.overrides))}</td><td>{r.seed}</td><td>{r.steps_to_acceptance}</td>"
                  f"<td><code>{_e(r.checkpoint_sha256)}</code></td>"
                  f"<td><code>gradlab play {_e(r.run_id)}:{r.steps_to_acceptance}</code></td></tr>" for r in promoted]
        parts.append("</table>")
    else:
        parts.append("<p class='note'>none</p>")
    parts.append(_datasets_html(datasets))
    return _page(f"gradlab: {goal_id}", "".join(parts))


def goal_datasets(settings) -> tuple[dict[str, list], list[str]]:
    """The dataset store's manifests by goal id, and one note per dataset that could not be read
    (a manifest that does not validate, a store that cannot be listed)."""
    from gradlab.datasets.store import list_datasets, read_dataset
    from gradlab.stores import open_dataset_store

    by_goal: dict[str, list] = defaultdict(list)
    notes: list[str] = []
    try:
        store = open_dataset_store(settings)
        names = list_datasets(store)
    except GradlabError as e:
        return by_goal, [f"datasets: {e}"]
    for name in names:
        try:
            manifest = read_dataset(store, name)
        except GradlabError as e:
            notes.append(str(e))
            continue
        by_goal[manifest.goal_id].append(manifest)
    return by_goal, notes


def _datasets_html(datasets: Sequence | None) -> str:
    """The goal's datasets: name, agent, episodes, steps, frames, and the command that plays an episode."""
    from gradlab.play.replay import agent_label

    if not datasets:
        return "<h2>Datasets</h2><p class='note'>none</p>"
    rows = "".join(
        f"<tr><td>{_e(m.name)}</td><td>{_e(agent_label(m.agent))}</td><td>{len(m.episodes)}</td>"
        f"<td>{sum(e.length for e in m.episodes)}</td><td>{'recorded' if m.frames else 'no'}</td>"
        f"<td><code>{_e(m.sha256[:16])}</code></td><td><code>gradlab dataset play {_e(m.name)} --episode 0</code></td></tr>"
        for m in sorted(datasets, key=lambda m: m.name))
    return ("<h2>Datasets</h2><table id='datasets'><tr><th>dataset</th><th>agent</th><th>episodes</th><th>steps</th>"
            f"<th>frames</th><th>sha256</th><th>play</th></tr>{rows}</table>"
            "<p class='note'>each episode plays in the web player: <code>gradlab dataset play NAME --episode K</code> "
            "(K from 0 to episodes - 1)</p>")


def build_site(settings, stores, out: Path | str, *, goal: str | None = None) -> BuiltSite:
    """Write the static site into ``out`` (created; existing pages are replaced).

    Args:
        goal: only this goal's page (and the index listing it).

    Raises:
        NotFound: ``goal`` (or, without it, any goal) has neither sealed runs nor datasets, or is not
            a goal of the experiments tree and has no runs.
        ContractViolation: ``out`` exists and is not a folder.
        PermanentError: the site cannot be written (names the path and the OS's reason).
    """
    root = Path(out)
    if root.exists() and not root.is_dir():
        raise ContractViolation(f"--out {root}: expected a folder for the site, found a file")
    if goal is not None:
        cohorts_mod.require_goal(stores, goal)
    results = cohorts_mod.goal_results(stores, goal)
    datasets, notes = goal_datasets(settings)
    if goal is not None:
        datasets = {goal: datasets[goal]} if goal in datasets else {}
    if not results and not datasets:
        raise NotFound(f"{'goal ' + goal if goal else 'the stores'}: no sealed runs in {stores.control.base_url} "
                       "and no datasets")
    by_goal: dict[str, list] = defaultdict(list, {g: [] for g in datasets})  # a goal with datasets only has a page
    for r in results:
        by_goal[r.goal_id].append(r)
    try:
        catalog = cohorts_mod._experiments().catalog
    except GradlabError:
        from gradlab.contracts.catalog import Catalog

        catalog = Catalog()
    pages = []
    listing: dict[str, list[str]] = defaultdict(list)
    for goal_id in sorted(by_goal):
        project = catalog.project_of(goal_id) or "other"
        rel = f"{project}/{goal_id}.html"
        _write(root / rel, goal_page(settings, stores, goal_id, by_goal[goal_id], notes,
                                     datasets=datasets.get(goal_id)))
        pages.append(rel)
        listing[project].append(goal_id)
    body = ["<h1>gradlab results</h1>"]
    for project in sorted(listing):
        title = catalog.projects[project].title if project in catalog.projects else project
        body.append(f"<h2>{_e(title)}</h2><ul>")
        body += [f"<li><a href='{_e(project)}/{_e(g)}.html'>{_e(g)}</a> ({plural(len(by_goal[g]), 'run')}"
                 f"{', ' + plural(len(datasets[g]), 'dataset') if datasets.get(g) else ''})</li>" for g in listing[project]]
        body.append("</ul>")
    _write(root / "index.html", _page("gradlab results", "".join(body)))
    return BuiltSite(root=root, pages=("index.html", *pages), goals=tuple(sorted(by_goal)), notes=tuple(notes))


def _write(target: Path, text: str) -> None:
    """Write one page (its folder created); an OS error becomes one error naming the path."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    except OSError as e:
        raise PermanentError(f"cannot write the report page {e.filename or target}: {e.strerror or e}") from None


def site_manifest(root: Path | str) -> dict[str, str]:
    """Every file of a built site (relative POSIX path) → its sha256, sorted by path."""
    root = Path(root)
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def build_hash(manifest: dict[str, str]) -> str:
    """sha256 of the manifest's canonical JSON (sorted keys, no spaces): the build's content hash."""
    return hashlib.sha256(json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def sync_site(root: Path | str, store, *, attempts: int = 8) -> dict:
    """Publish a built site to ``store`` (see the module docstring).

    Returns:
        ``{"build": sha256, "files": n, "uploaded": n_new, "index": {...}}``.

    Raises:
        ContractViolation: ``root`` holds no ``index.html``.
        Conflict: the index kept changing under us for ``attempts`` tries.
        IntegrityError: a file read back differs from the bytes written.
        PermanentError: the store cannot be written (an OS error: names the store, the path and why).
    """
    root = Path(root)
    if not (root / "index.html").is_file():
        raise ContractViolation(f"{root}: not a built report site (no index.html); run `gradlab reports build` first")
    try:
        return _sync(root, store, attempts)
    except GradlabError:
        raise
    except OSError as e:
        where = e.filename or store.base_url
        raise PermanentError(f"reports sync: cannot write to the store {store.base_url} ({where}): "
                             f"{e.strerror or e}") from None


def _sync(root: Path, store, attempts: int) -> dict:
    manifest = site_manifest(root)
    digest = build_hash(manifest)
    prefix = f"{REPORTS_PREFIX}builds/{digest}/"
    uploaded = 0
    for rel in manifest:
        key = prefix + rel
        if not store.exists(key):
            uploaded += 1
        store.put_verified(key, (root / rel).read_bytes())
    store.put_verified(prefix + "manifest.json", (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())
    for _ in range(attempts):
        try:
            data, etag = store.get_with_etag(INDEX_KEY)
            index = json.loads(data)
        except NotFound:
            index, etag = {"latest": None, "builds": []}, None
        if index.get("latest") == digest:
            break
        builds = [b for b in index.get("builds", []) if b.get("build") != digest]
        builds.append({"build": digest, "files": len(manifest), "synced_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       "index": prefix + "index.html"})
        index = {"latest": digest, "builds": builds}
        try:
            store.put_if_match(INDEX_KEY, (json.dumps(index, indent=1, sort_keys=True) + "\n").encode(), etag)
            break
        except Conflict:
            continue
    else:
        raise Conflict(f"{store.url(INDEX_KEY)}: the index changed under every one of {attempts} tries")
    return {"build": digest, "files": len(manifest), "uploaded": uploaded, "url": store.url(prefix + "index.html"),
            "index": index}


def reports_store_url(settings) -> str:
    """Where ``reports sync`` publishes: ``GRADLAB_REPORTS_STORE_URL``, else the model store."""
    import os

    return os.environ.get("GRADLAB_REPORTS_STORE_URL") or settings.model_store_url

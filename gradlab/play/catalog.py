"""The player's catalog: projects → goals → runs → checkpoints, read from the configured stores.

Projects and goals come from the experiments tree (``experiments/goals/_catalog.yaml``); runs,
checkpoints, evaluations and promotions from the receipt stores (:func:`gradlab.stores.open_stores`:
file or S3), so runs trained on this machine appear with no extra setup; a goal's datasets from the
dataset store (:func:`gradlab.stores.open_dataset_store`). Every function returns
the pydantic page of :mod:`gradlab.play.protocol` that the matching API route serves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from gradlab.contracts.experiments import goal_family
from gradlab.errors import GradlabError, NotFound
from gradlab.play.protocol import (
    CheckpointRow,
    DatasetPage,
    DatasetRow,
    EpisodeRow,
    GoalPage,
    GoalRow,
    PlaybackPage,
    ProjectPage,
    ProjectRow,
    ProjectsPage,
    RunPage,
    RunRow,
)


def evaluation_word(status: str | None, *, asked: bool, sealed: bool) -> str:
    """One word per evaluation state, as ``gradlab runs show`` says it (gradlab.runs.view): the
    result's verdict when there is one; with none, ``running`` (asked) or ``queued`` (published, not
    yet asked) while the run's last attempt is open, and ``deferred`` (not evaluated) once it is sealed."""
    if status is not None:
        return status
    if sealed:
        return "deferred"
    return "running" if asked else "queued"


@dataclass
class Catalog:
    """Readers over one experiments tree and one set of stores.

    Args:
        stores: :class:`gradlab.stores.Stores`.
        experiments: :class:`gradlab.contracts.Experiments` (default: the checked-in tree).
        settings: :class:`gradlab.settings.Settings` (run directories and the checkpoint cache).
    """

    stores: Any
    settings: Any
    experiments: Any = None
    #: Checkpoints given on the command line (a folder outside any store): (run_id, step) → resolved.
    pinned: dict[tuple[str, int], Any] = field(default_factory=dict)
    _records: dict[str, Any] = field(default_factory=dict)
    _manifests: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.experiments is None:
            from gradlab.contracts import Experiments

            self.experiments = Experiments()

    # -- helpers ---------------------------------------------------------------------------
    def _runs(self) -> list[Any]:
        """Every run record in the control store (records are immutable: cached)."""
        from gradlab import receipts as rules

        out = []
        for run_id in rules.list_runs(self.stores):
            rec = self._records.get(run_id)
            if rec is None:
                rec = self._records[run_id] = rules.read_run(self.stores, run_id)
            out.append(rec)
        return out

    def _project(self, project: str) -> Any:
        projects = self.experiments.catalog.projects
        if project not in projects:
            raise NotFound(f"no project {project!r} in the goal catalog (projects: {', '.join(projects)})")
        return projects[project]

    def project_of(self, goal_id: str) -> str | None:
        return self.experiments.catalog.project_of(goal_id)

    def _project_goals(self, project: str) -> list[str]:
        """The project's goals with families expanded; a listed goal gone from the tree stays listed."""
        known = self.experiments.goal_ids()
        families = self.experiments.families()
        catalog = self.experiments.catalog
        listed = [g for g in catalog.projects[project].goals if g not in known and g not in families]
        return catalog.goals_of(project, known) + listed

    # -- pages -----------------------------------------------------------------------------
    def projects_page(self) -> ProjectsPage:
        runs = self._runs()
        rows = []
        for name, project in self.experiments.catalog.projects.items():
            goals = set(self._project_goals(name))
            rows.append(ProjectRow(project=name, title=project.title, description=project.description,
                                   goals=len(goals), runs=sum(r.goal_id in goals for r in runs)))
        s = self.stores
        return ProjectsPage(projects=rows, stores={"control": s.control.base_url, "eval": s.eval.base_url,
                                                   "model": s.model.base_url})

    def project_page(self, project: str) -> ProjectPage:
        proj = self._project(project)
        runs = self._runs()
        rows = []
        for goal_id in self._project_goals(project):
            count = sum(r.goal_id == goal_id for r in runs)
            family = goal_family(goal_id)
            try:
                goal = self.experiments.load_goal(goal_id)
            except GradlabError as e:  # a goal that no longer validates: shown, not fatal
                rows.append(GoalRow(goal_id=goal_id, family=family, runs=count, error=str(e)))
                continue
            env = goal.train.environment
            rows.append(GoalRow(goal_id=goal_id, family=family, title=goal.title, description=goal.description,
                                env=f"{env.provider}:{env.env_id}", runs=count))
        return ProjectPage(project=project, title=proj.title, description=proj.description, goals=rows)

    def goal_page(self, project: str, goal_id: str) -> GoalPage:
        self._project(project)
        goals = self._project_goals(project)
        if goal_id not in goals:
            raise NotFound(f"project {project!r} has no goal {goal_id!r} (goals: {', '.join(goals)})")
        title, error = "", None
        try:
            title = self.experiments.load_goal(goal_id).title
        except GradlabError as e:
            error = str(e)
        rows = [self._run_row(rec) for rec in self._runs() if rec.goal_id == goal_id]
        datasets, datasets_error = [], None
        try:
            datasets = [_dataset_row(m) for m in self._datasets() if m.goal_id == goal_id]
        except GradlabError as e:  # a dataset store that cannot be read does not hide the runs
            datasets_error = str(e)
        return GoalPage(project=project, goal_id=goal_id, title=title, error=error, runs=rows, datasets=datasets,
                        datasets_error=datasets_error)

    # -- datasets --------------------------------------------------------------------------
    def _datasets(self) -> list[Any]:
        """Every dataset manifest in the dataset store (manifests are create-only: cached). A manifest
        that does not validate is left out here (``gradlab dataset list`` names it)."""
        from gradlab.datasets.store import list_datasets, read_dataset
        from gradlab.stores import open_dataset_store

        store = open_dataset_store(self.settings)
        out = []
        for name in list_datasets(store):
            manifest = self._manifests.get(name)
            if manifest is None:
                try:
                    manifest = self._manifests[name] = read_dataset(store, name)
                except GradlabError:
                    continue
            out.append(manifest)
        return out

    def dataset_page(self, name: str) -> DatasetPage:
        """A dataset's summary and episodes (each playable at ``/datasets/{name}/episodes/{index}``).

        Raises:
            NotFound: no such dataset. ContractViolation: its manifest does not validate.
        """
        from gradlab.datasets.store import read_dataset
        from gradlab.stores import open_dataset_store

        manifest = self._manifests.get(name) or read_dataset(open_dataset_store(self.settings), name)
        self._manifests[name] = manifest
        episodes = [EpisodeRow(index=e.index, seed=e.seed, start=e.start, outcome=e.outcome, reason=e.reason,
                               length=e.length, return_=e.return_, raw_return=e.raw_return,
                               frames=e.frames_file is not None) for e in manifest.episodes]
        return DatasetPage(name=name, project=self.project_of(manifest.goal_id), goal_id=manifest.goal_id,
                           summary=_dataset_row(manifest), provenance=manifest.agent.model_dump(mode="json"),
                           episodes=episodes)

    def _run_row(self, rec: Any) -> RunRow:
        from gradlab import receipts as rules

        attempts = rules.list_attempts(self.stores, rec.run_id)
        terminal = rules.read_terminal(self.stores, rec.run_id, attempts[-1].attempt_id) if attempts else None
        promotion = rules.read_promotion(self.stores, rec.run_id)
        best, interval = None, None
        for _, record in rules.list_evaluations(self.stores, rec.run_id):
            if record is None or record.return_mean is None:
                continue
            if best is None or record.return_mean > best:
                best = float(record.return_mean)
                interval = _interval(record.result)
        # The receipts' own span: the first attempt's start to the latest attempt's seal (the clock
        # time to acceptance is measured from too), not the run record's creation.
        duration = (terminal.sealed_at - attempts[0].started_at).total_seconds() if terminal else None
        return RunRow(run_id=rec.run_id, recipe_id=rec.recipe_id, seed=rec.seed,
                      outcome=terminal.outcome if terminal else ("running" if attempts else None),
                      final_step=terminal.final_step if terminal else None,
                      promoted_step=promotion.checkpoint_step if promotion else None,
                      best_return_mean=best, best_return_ci95=interval,
                      started_at=(attempts[0].started_at if attempts else rec.created_at).isoformat(),
                      duration_s=round(duration, 1) if duration is not None else None)

    def _record(self, run_id: str) -> Any:
        from gradlab import receipts as rules

        try:
            return rules.read_run(self.stores, run_id)
        except NotFound:
            raise NotFound(f"no run {run_id} in {self.stores.control.base_url}") from None

    def pin(self, resolved: Any) -> tuple[str, int]:
        """Make a resolved checkpoint playable by (run id, step) even when no store lists it."""
        from gradlab.checkpoints import read_manifest

        manifest = read_manifest(resolved.path)
        key = (str(resolved.spec["run_id"]), int(manifest.step))
        self.pinned[key] = resolved
        return key

    def _pinned_run_page(self, run_id: str) -> RunPage | None:
        from gradlab.checkpoints import read_manifest

        rows = []
        spec = None
        for (rid, step), resolved in sorted(self.pinned.items()):
            if rid != run_id:
                continue
            manifest = read_manifest(resolved.path)
            spec = resolved.spec
            rows.append(CheckpointRow(step=step, sha256=manifest.sha256, purpose=str(manifest.purpose),
                                      evaluation=None, promoted=False,
                                      size_bytes=sum(f.stat().st_size for f in resolved.path.rglob("*") if f.is_file())))
        if spec is None:
            return None
        return RunPage(run_id=run_id, project=self.project_of(spec["goal_id"]), goal_id=spec["goal_id"],
                       recipe_id=spec["recipe_id"], seed=int(spec["seed"]), outcome=None, checkpoints=rows)

    def run_page(self, run_id: str) -> RunPage:
        from gradlab import receipts as rules

        try:
            rec = self._record(run_id)
        except NotFound:
            pinned = self._pinned_run_page(run_id)
            if pinned is None:
                raise
            return pinned
        publications = rules.list_publications(self.stores, run_id)
        evaluations = {intent.checkpoint_sha256: (intent, record)
                       for intent, record in rules.list_evaluations(self.stores, run_id)}
        promotion = rules.read_promotion(self.stores, run_id)
        attempts = rules.list_attempts(self.stores, run_id)
        terminal = rules.read_terminal(self.stores, run_id, attempts[-1].attempt_id) if attempts else None
        rows = []
        for pub in publications:
            intent_record = evaluations.get(pub.sha256)
            record = intent_record[1] if intent_record else None
            status = evaluation_word(record.status if record else None, asked=intent_record is not None,
                                     sealed=terminal is not None)
            rows.append(CheckpointRow(
                step=pub.step, sha256=pub.sha256, purpose=pub.purpose, evaluation=status,
                return_mean=record.return_mean if record else None,
                promoted=promotion is not None and promotion.checkpoint_sha256 == pub.sha256,
                size_bytes=sum(f.size_bytes for f in pub.files.values())))
        return RunPage(run_id=run_id, project=self.project_of(rec.goal_id), goal_id=rec.goal_id,
                       recipe_id=rec.recipe_id, seed=rec.seed,
                       outcome=terminal.outcome if terminal else ("running" if attempts else None), checkpoints=rows)

    def playback_page(self, run_id: str, step: int) -> PlaybackPage:
        """The checkpoint at ``step`` with its neighbours; a checkpoint that cannot be played names why."""
        page = self.run_page(run_id)
        steps = [c.step for c in page.checkpoints]
        row = next((c for c in page.checkpoints if c.step == step), None)
        if row is None:
            raise NotFound(f"run {run_id}: no checkpoint at step {step} (steps: {', '.join(map(str, steps)) or 'none'})")
        i = steps.index(step)
        error = None
        backend = None
        try:
            from gradlab import receipts as rules
            from gradlab.evaluation.runner import parse_spec

            pinned = self.pinned.get((run_id, step))
            spec = pinned.spec if pinned is not None else rules.read_run_spec(self.stores, run_id)
            backend = parse_spec(spec, source=f"run {run_id} spec").recipe.train.backend.id
        except GradlabError as e:
            error = str(e)
        from gradlab.play.archive import ARCHIVE_BACKEND, SEQUENCES_BACKEND

        return PlaybackPage(run_id=run_id, project=page.project, goal_id=page.goal_id, recipe_id=page.recipe_id,
                            step=step, sha256=row.sha256, promoted=row.promoted,
                            previous_step=steps[i - 1] if i > 0 else None,
                            next_step=steps[i + 1] if i + 1 < len(steps) else None, error=error,
                            archive=backend == ARCHIVE_BACKEND, sequences=backend == SEQUENCES_BACKEND)

    def archive_page(self, run_id: str, step: int) -> Any:
        """The archive of the search checkpoint at ``step`` (:func:`gradlab.play.archive.archive_page`).

        Raises:
            NotFound: no such checkpoint, or it keeps no archive. IntegrityError: it does not verify.
        """
        from gradlab.play.archive import archive_page

        resolved = self.resolve(run_id, step)
        return archive_page(run_id, step, resolved.path, resolved.spec)

    def sequences_page(self, run_id: str, step: int) -> Any:
        """The retained sequences of the JERK checkpoint at ``step`` (:func:`gradlab.play.archive.sequences_page`).

        Raises:
            NotFound: no such checkpoint, or it retains no sequences. IntegrityError: it does not verify.
        """
        from gradlab.play.archive import sequences_page

        return sequences_page(run_id, step, self.resolve(run_id, step).path)

    def resolve(self, run_id: str, step: int | None) -> Any:
        """The verified local checkpoint folder and run spec (downloaded and verified when needed).

        Returns:
            :class:`gradlab.checkpoints.resolve.ResolvedCheckpoint` (``path``, ``spec``, ``spec_source``,
            ``origin``); a copy passed over (damaged) is logged as a warning.

        Raises:
            NotFound, IntegrityError: as ``gradlab eval`` resolves ``RUN_ID[:STEP]``.
        """
        # The one resolver of RUN_ID[:STEP] (promoted, newest, local copies, verified downloads).
        from gradlab.checkpoints.resolve import resolve_checkpoint

        if step is not None and (run_id, step) in self.pinned:
            return self.pinned[(run_id, step)]
        ref = run_id if step is None else f"{run_id}:{step}"
        return resolve_checkpoint(ref, settings=self.settings, stores=self.stores)


def _dataset_row(manifest: Any) -> DatasetRow:
    from gradlab.play.replay import agent_label

    returns = [e.return_ for e in manifest.episodes]
    return DatasetRow(name=manifest.name, sha256=manifest.sha256, agent=agent_label(manifest.agent),
                      episodes=len(manifest.episodes), steps=sum(e.length for e in manifest.episodes),
                      return_mean=sum(returns) / len(returns) if returns else 0.0, frames=manifest.frames,
                      determinism=manifest.determinism, created_at=manifest.created_at)


def _interval(result: dict[str, Any] | None) -> tuple[float, float] | None:
    """mean ± 1.96 std / sqrt(n) of an evaluation result's episode returns (normal approximation)."""
    if not result:
        return None
    agg = result.get("aggregates", {})
    mean, std, n = agg.get("eval/episode/return/mean"), agg.get("eval/episode/return/std"), result.get("completed")
    if mean is None or std is None or not n:
        return None
    half = 1.96 * float(std) / math.sqrt(float(n))
    return (float(mean) - half, float(mean) + half)

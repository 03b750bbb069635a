"""The goal catalog: goals and goal families grouped into projects for the player and reports."""

from __future__ import annotations

from pydantic import Field

from gradlab.contracts.base import Contract


class Project(Contract):
    title: str
    description: str = ""
    goals: list[str] = Field(default_factory=list, description="Goal ids, or family ids (a folder path "
                             "such as SuperMarioBros-Nes-v0) that stand for every goal below them.")


class Catalog(Contract):
    projects: dict[str, Project] = Field(default_factory=dict)

    def project_of(self, goal_id: str) -> str | None:
        """The project listing ``goal_id`` itself or, failing that, its nearest listed family."""
        best: tuple[int, str] | None = None
        for name, project in self.projects.items():
            for entry in project.goals:
                if goal_id == entry:
                    return name
                if goal_id.startswith(entry + "/") and (best is None or len(entry) > best[0]):
                    best = (len(entry), name)
        return best[1] if best else None

    def goals_of(self, project: str, goal_ids: list[str]) -> list[str]:
        """The goals of ``project`` among ``goal_ids``, families expanded, in catalog order.

        A goal whose nearest catalog entry is another project's is not included.
        """
        entries = self.projects[project].goals if project in self.projects else []
        out: list[str] = []
        for entry in entries:
            for gid in [entry] if entry in goal_ids else [g for g in goal_ids if g.startswith(entry + "/")]:
                if gid not in out and self.project_of(gid) == project:
                    out.append(gid)
        return out

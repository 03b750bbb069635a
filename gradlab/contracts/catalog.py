"""The goal catalog: goals grouped into projects for the player and reports."""

from __future__ import annotations

from pydantic import Field

from gradlab.contracts.base import Contract


class Project(Contract):
    title: str
    description: str = ""
    goals: list[str] = Field(default_factory=list)


class Catalog(Contract):
    projects: dict[str, Project] = Field(default_factory=dict)

    def project_of(self, goal_id: str) -> str | None:
        for name, project in self.projects.items():
            if goal_id in project.goals:
                return name
        return None

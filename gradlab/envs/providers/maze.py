"""``KeyDoor-v0``: the built-in hard-exploration maze (deterministic, no reward until the goal).

Two rooms joined by a locked door. The agent starts in the top-left corner of the left room, the
key lies in the opposite corner of that room, the door (one cell of the wall between the rooms)
opens only while the agent holds the key, and the goal is the far corner of the right room.
Reaching the goal gives native reward 1.0 and terminates; no other step is rewarded, so an
agent acting at random almost never sees a reward (measured in ``tests/envs/test_maze.py``).

* Observation: float32 (3,) = (x / (W - 1), y / (H - 1), has_key).
* Actions: Discrete(4), ``UP, RIGHT, DOWN, LEFT``; a move into a wall (or the locked door) stays.
* ``info``: ``x``, ``y``, ``has_key`` (0/1), ``room`` (0 left, 1 right), ``at_goal`` (bool).
* No time limit of its own: the goal's task program sets ``max_episode_steps``.
* The dynamics ignore the reset seed: the same actions give the same episode in every lane.
* ``provider_args``: ``layout`` (rows of ``#`` wall, ``.`` floor, ``S`` start, ``K`` key, ``D``
  door, ``G`` goal); default :data:`LAYOUT`. ``starts`` names start states, each
  ``[x, y, has_key]`` on a floor cell (``{door: [8, 4, 1]}``: beside the door, key in hand): a reset
  with ``options={"start": name}`` (``VectorEnv.set_next_start``) begins there, any other at ``S``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gradlab.envs.snapshot import Snapshot, pack, unpack

LAYOUT: tuple[str, ...] = (
    "###################",
    "#S.......#........#",
    "#........#........#",
    "#........#........#",
    "#........D........#",
    "#........#........#",
    "#........#........#",
    "#........K#......G#",
    "###################",
)
ACTION_MEANINGS = ["UP", "RIGHT", "DOWN", "LEFT"]
_MOVES = ((0, -1), (1, 0), (0, 1), (-1, 0))
_CELL_PX = 4
_KIND = "gradlab:KeyDoor-v0"


class KeyDoorArgs(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    layout: list[str] = Field(default_factory=lambda: list(LAYOUT),
                              description="Rows of # . S K D G (wall, floor, start, key, door, goal).")
    starts: dict[str, tuple[int, int, int]] = Field(
        default_factory=dict, description="Start state name -> [x, y, has_key] (a floor cell; has_key 0 or 1).")

    @field_validator("layout")
    @classmethod
    def _check_layout(cls, rows: list[str]) -> list[str]:
        if not rows or len({len(r) for r in rows}) != 1:
            raise ValueError("rows of equal length")
        text = "".join(rows)
        if set(text) - set("#.SKDG"):
            raise ValueError(f"only the characters # . S K D G, found {sorted(set(text) - set('#.SKDG'))}")
        for ch in "SKG":
            if text.count(ch) != 1:
                raise ValueError(f"exactly one {ch!r}, found {text.count(ch)}")
        return rows

    @model_validator(mode="after")
    def _check_starts(self) -> KeyDoorArgs:
        for name, (x, y, key) in self.starts.items():
            inside = 0 <= y < len(self.layout) and 0 <= x < len(self.layout[0])
            if not inside or self.layout[y][x] in "#DG" or key not in (0, 1):
                raise ValueError(f"starts.{name}: expected [x, y, has_key] on a floor cell with has_key 0 or 1, "
                                 f"found {[x, y, key]}")
        return self


def _find(rows: list[str], ch: str) -> tuple[int, int]:
    for y, row in enumerate(rows):
        if ch in row:
            return row.index(ch), y
    raise ValueError(ch)  # pragma: no cover - the validator guarantees it


class KeyDoorEnv:
    """One lane of the maze (gymnasium-style API)."""

    def __init__(self, args: KeyDoorArgs, lane: int = 0, render_mode: str | None = None):
        from gymnasium.spaces import Box, Discrete

        self.lane = lane
        self.render_mode = render_mode
        self.rows = list(args.layout)
        self.h, self.w = len(self.rows), len(self.rows[0])
        self.walls = np.array([[c == "#" for c in row] for row in self.rows], dtype=bool)
        self.doors = np.array([[c == "D" for c in row] for row in self.rows], dtype=bool)
        self.start = _find(self.rows, "S")
        self.key = _find(self.rows, "K")
        self.goal = _find(self.rows, "G")
        door_x = [x for row in self.rows for x, c in enumerate(row) if c == "D"]
        self.door_x = door_x[0] if door_x else self.w
        self.observation_space = Box(0.0, 1.0, shape=(3,), dtype=np.float32)
        self.action_space = Discrete(4)
        self.x, self.y = self.start
        self.has_key = 0
        self.t = 0
        self.start_states = {name: tuple(v) for name, v in args.starts.items()}
        #: Named start states (None: the maze has one start).
        self.starts = tuple(self.start_states) or None

    def _obs(self) -> np.ndarray:
        return np.array([self.x / (self.w - 1), self.y / (self.h - 1), float(self.has_key)], dtype=np.float32)

    def _info(self) -> dict[str, Any]:
        return {"x": self.x, "y": self.y, "has_key": self.has_key, "room": int(self.x > self.door_x),
                "at_goal": (self.x, self.y) == self.goal}

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        start = (options or {}).get("start")
        if start is None:
            (self.x, self.y), self.has_key = self.start, 0
        elif start in self.start_states:
            self.x, self.y, self.has_key = self.start_states[start]
        else:
            raise ValueError(f"KeyDoor-v0: start: expected one of {sorted(self.start_states)}, found {start!r}")
        self.t = 0
        return self._obs(), {**self._info(), **({"start": start} if start is not None else {})}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        dx, dy = _MOVES[int(action)]
        nx, ny = self.x + dx, self.y + dy
        if not self.walls[ny, nx] and (not self.doors[ny, nx] or self.has_key):
            self.x, self.y = nx, ny
        if (self.x, self.y) == self.key:
            self.has_key = 1
        self.t += 1
        at_goal = (self.x, self.y) == self.goal
        return self._obs(), 1.0 if at_goal else 0.0, at_goal, False, self._info()

    def capture_state(self) -> bytes:
        """Position, key and step count as a snapshot (:mod:`gradlab.envs.snapshot`)."""
        return pack(Snapshot(_KIND, meta={"x": self.x, "y": self.y, "has_key": self.has_key, "t": self.t,
                                          "layout": self.rows}))

    def restore_state(self, state: bytes) -> np.ndarray:
        """Assign a :meth:`capture_state` snapshot; returns the observation there.

        Raises:
            IntegrityError: not a KeyDoor-v0 snapshot, or one of another layout.
        """
        from gradlab.errors import IntegrityError

        meta = unpack(state, kind=_KIND).meta
        if meta["layout"] != self.rows:
            raise IntegrityError("provider state: the KeyDoor-v0 snapshot was taken in another layout")
        self.x, self.y, self.has_key, self.t = int(meta["x"]), int(meta["y"]), int(meta["has_key"]), int(meta["t"])
        return self._obs()

    def state_problem(self) -> str | None:
        return None

    def render(self) -> np.ndarray:
        grid = np.full((self.h, self.w, 3), 230, dtype=np.uint8)
        grid[self.walls] = (40, 40, 40)
        grid[self.doors] = (150, 90, 30) if not self.has_key else (220, 200, 160)
        if not self.has_key:
            grid[self.key[1], self.key[0]] = (255, 200, 0)
        grid[self.goal[1], self.goal[0]] = (0, 180, 0)
        grid[self.y, self.x] = (30, 90, 255)
        return np.repeat(np.repeat(grid, _CELL_PX, axis=0), _CELL_PX, axis=1)

    def close(self) -> None:
        return None

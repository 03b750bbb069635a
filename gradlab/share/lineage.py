"""Warm starts (``gradlab train --init-from``): the checks made before any compute is spent.

The learner checks the tensors themselves (:func:`gradlab.learn.warm_start.check_warm_start_tensors`);
this module compares the parent's recorded spaces with the new run's environment, so a parent of
another observation or action space is refused before a learner starts.
"""

from __future__ import annotations

from pathlib import Path

from gradlab.contracts.environment import EnvironmentSpec
from gradlab.errors import ContractViolation


def _describe(spec) -> str:  # a SpaceSpec
    if spec.type == "Discrete":
        return f"Discrete({spec.n})"
    return f"{spec.type}{tuple(spec.shape)} {spec.dtype}"


def check_spaces(parent_dir: Path, environment: EnvironmentSpec, *, source: str) -> None:
    """Refuse a parent whose observation or action space differs from ``environment``'s.

    Raises:
        ContractViolation: ``--init-from SOURCE: observation space ...: expected ..., found ...``.
    """
    from gradlab.checkpoints.policy import check_policy_files, space_to_spec
    from gradlab.envs import make_vector_env

    parent = check_policy_files(Path(parent_dir))  # a malformed spec or weights header: one line, nothing built
    venv = make_vector_env(environment.model_copy(update={"n_envs": 1}), seed=0)
    try:
        obs, act = space_to_spec(venv.single_observation_space), space_to_spec(venv.single_action_space)
    finally:
        venv.close()
    for what, mine, theirs in (("observation", obs, parent.observation_space), ("action", act, parent.action_space)):
        if (mine.type, mine.shape, mine.n, mine.dtype) != (theirs.type, theirs.shape, theirs.n, theirs.dtype):
            raise ContractViolation(f"--init-from {source}: {what} space of {environment.env_id} is {_describe(mine)}, "
                                    f"the parent checkpoint was trained on {_describe(theirs)}")

"""Resume state both training backends write and read the same way (docs/ARCHITECTURE.md section 6).

A checkpoint's ``resume/state.json`` holds every RNG stream (:func:`rng_state`,
:func:`set_rng_state`) and says in ``env_state`` whether the lane state was saved
(:data:`LANES_SAVED`); ``resume/vecnormalize.json`` holds the normalisation statistics
(:func:`vecnormalize_state`, :func:`load_vecnormalize_state`); the policy parameters come from
the weights-only ``policy.safetensors`` (:func:`policy_tensors`, :func:`load_resume_policy`).
Nothing here unpickles: JSON and safetensors only.
"""

from __future__ import annotations

import base64
import json
import random
from pathlib import Path
from typing import Any

import numpy as np

from gradlab.checkpoints.manifest import RESUME_DIR, WEIGHTS_FILE
from gradlab.errors import ContractViolation

LANES_SAVED = "lanes"
"""``state.json``'s ``env_state`` when ``lanes.json``/``lanes.npz`` hold the lane state."""


def rng_state() -> dict[str, Any]:
    """Python's, NumPy's global and torch's (CPU, and CUDA when initialised) RNG states as JSON data.

    Returns:
        ``{"python": [version, state list, gauss], "numpy": [name, keys (624 uint32 as ints), pos,
        has_gauss, cached_gaussian], "torch": base64 of the CPU generator's uint8 state}``, plus
        ``"torch_cuda"`` (one base64 state per device) when CUDA is initialised.
    """
    import torch

    py = random.getstate()
    np_state = np.random.get_state()
    state = {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode("ascii"),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["torch_cuda"] = [base64.b64encode(s.numpy().tobytes()).decode("ascii") for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore the RNG states :func:`rng_state` returned (CUDA's only when CUDA is available).

    Raises:
        KeyError: a stream is missing from ``state``.
    """
    import torch

    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state((n[0], np.asarray(n[1], dtype=np.uint32), n[2], n[3], n[4]))
    torch.set_rng_state(torch.from_numpy(np.frombuffer(base64.b64decode(state["torch"]), dtype=np.uint8).copy()))
    if "torch_cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([
            torch.from_numpy(np.frombuffer(base64.b64decode(s), dtype=np.uint8).copy()) for s in state["torch_cuda"]
        ])


def vecnormalize_state(vn: Any) -> dict[str, Any]:
    """A ``VecNormalize``'s (or :class:`gradlab.learn.ppo_state.Normaliser`'s) statistics and settings
    as JSON data: ``resume/vecnormalize.json`` of both PPO backends.

    Returns:
        ``obs_rms`` (``{"mean", "var"}`` of the observation shape as nested lists, float ``count``;
        null when observations are not normalised), ``ret_rms`` (scalars), ``returns`` (one float
        per lane), and the settings ``clip_obs``, ``clip_reward``, ``gamma``, ``epsilon``,
        ``norm_obs``, ``norm_reward``.
    """

    def rms(r: Any) -> dict[str, Any]:
        return {"mean": np.asarray(r.mean).tolist(), "var": np.asarray(r.var).tolist(), "count": float(r.count)}

    # VecNormalize has no obs_rms when only rewards are normalised: null then.
    return {"obs_rms": rms(vn.obs_rms) if vn.norm_obs else None, "ret_rms": rms(vn.ret_rms),
            "returns": np.asarray(vn.returns).tolist(),
            "clip_obs": vn.clip_obs, "clip_reward": vn.clip_reward, "gamma": vn.gamma, "epsilon": vn.epsilon,
            "norm_obs": vn.norm_obs, "norm_reward": vn.norm_reward}


def load_vecnormalize_state(vn: Any, data: dict[str, Any]) -> None:
    """Assign :func:`vecnormalize_state`'s statistics back (float64 arrays; settings come from the recipe).

    Args:
        vn: a ``VecNormalize`` or :class:`gradlab.learn.ppo_state.Normaliser` built from the same recipe.
        data: the parsed ``vecnormalize.json``; ``obs_rms`` is read only when ``vn.norm_obs``.

    Raises:
        KeyError: a statistic is missing from ``data``.
    """
    for name in ("obs_rms", "ret_rms") if vn.norm_obs else ("ret_rms",):
        r = getattr(vn, name)
        r.mean = np.asarray(data[name]["mean"], dtype=np.float64)
        r.var = np.asarray(data[name]["var"], dtype=np.float64)
        r.count = float(data[name]["count"])
    vn.returns = np.asarray(data["returns"], dtype=np.float64)


def policy_tensors(checkpoint: Path) -> dict[str, Any]:
    """A checkpoint folder's weights-only policy tensors (SB3's names), without gradlab's own entries.

    Returns:
        {tensor name: CPU tensor} from ``policy.safetensors``, the ``gradlab.*`` entries (observation
        statistics) left out.
    """
    from safetensors.torch import load_file

    return {k: v for k, v in load_file(str(Path(checkpoint) / WEIGHTS_FILE)).items() if not k.startswith("gradlab.")}


def load_resume_policy(checkpoint: Path, backend_id: str, module: Any) -> dict[str, Any]:
    """Read ``resume/state.json`` of a ``backend_id`` checkpoint and load its policy into ``module``.

    Returns:
        The parsed ``state.json``.

    Raises:
        ContractViolation: the checkpoint is of another backend, or its tensors do not fit ``module``.
    """
    state_file = Path(checkpoint) / RESUME_DIR / "state.json"
    state = json.loads(state_file.read_text())
    if state.get("backend_id") != backend_id:
        raise ContractViolation(f"{state_file}: backend expected {backend_id}, found {state.get('backend_id')}")
    try:
        module.load_state_dict(policy_tensors(checkpoint), strict=True)
    except RuntimeError as e:
        raise ContractViolation(f"{Path(checkpoint) / WEIGHTS_FILE}: does not fit this recipe's policy: {e}") from None
    return state


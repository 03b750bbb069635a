"""``gradlab.ppo``'s rollout: ``n_steps`` per lane into preallocated tensors, then GAE.

:func:`collect_rollout` is stable-baselines3 2.x's ``OnPolicyAlgorithm.collect_rollouts`` and
``RolloutBuffer.compute_returns_and_advantage`` over gradlab's vector env, written for speed:

* the rollout lives in the backend's ``(n_steps, n_envs)`` tensors (``buf_obs``, ``buf_actions``,
  ``buf_logp``, ``buf_values``, ``buf_rewards``, ``buf_boot``, ``buf_dones``, allocated by
  :meth:`gradlab.learn.ppo.PPOBackend.setup`), written in place; the policy step is a few tensor
  operations (:func:`gradlab.learn.ppo_net.sample_actions`, no distribution objects);
* a truncated step's reward gets ``gamma * V(true final observation)`` (the vector env keeps it in
  ``StepResult.final_obs``); a terminated step is never bootstrapped;
* MLPs compute only the action head per step and the values and log-probabilities of the whole
  rollout in one batched forward afterwards; CNNs take both heads per step;
* two lane groups (:mod:`gradlab.envs.groups`) overlap one group's env step with the other's
  forward pass; normalisation (``train.normalize``) applies ``VecNormalize``'s order
  (:class:`gradlab.learn.ppo_state.Normaliser`);
* :func:`compute_gae` is SB3's recursion, on the backend's device;
* with ``train.curriculum.archive`` the backend's :class:`gradlab.learn.ppo_curriculum.ArchiveCurriculumRunner`
  sees every step's result (episodes by origin, archived starts, new cells) and the raw advantages.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from gradlab.learn.ppo_net import log_prob_entropy, sample_actions
from gradlab.learn.stats import RolloutStats


def compute_gae(rewards: Any, values: Any, dones: Any, last_values: Any, gamma: float, gae_lambda: float) -> tuple[Any, Any]:
    """Generalised advantage estimation (Schulman et al. 2016, eq. 16), SB3's recursion.

    Works on numpy arrays or torch tensors alike (only arithmetic and indexing).

    Args:
        rewards: (T, N) float32, each step's reward with ``gamma * V(final obs)`` already added
            on truncated steps.
        values: (T, N) float32, V(s_t) of the rollout's observations.
        dones: (T, N) float32, 1.0 where the lane's episode ended at step t (terminated or truncated).
        last_values: (N,) float32, V of the observation after the last step.

    Returns:
        (advantages (T, N), returns (T, N) = advantages + values).
    """
    advantages = values * 0
    last = last_values * 0
    for t in reversed(range(rewards.shape[0])):
        next_values = last_values if t == rewards.shape[0] - 1 else values[t + 1]
        not_done = 1.0 - dones[t]
        delta = rewards[t] + gamma * next_values * not_done - values[t]
        last = delta + gamma * gae_lambda * not_done * last
        advantages[t] = last
    return advantages, advantages + values


def _to_device(device: Any, array: np.ndarray) -> Any:
    """``array`` as a torch tensor on ``device`` (shared memory on a CPU; an asynchronous copy otherwise)."""
    import torch

    t = torch.from_numpy(np.ascontiguousarray(array))
    return t if device.type == "cpu" else t.to(device, non_blocking=True)


def collect_rollout(b: Any) -> None:
    """One rollout of ``n_steps`` per lane of a set-up :class:`gradlab.learn.ppo.PPOBackend` ``b``.

    Fills ``b``'s rollout tensors from ``b._obs`` on (the lanes' current observations), adds
    finished episodes to ``b.episodes``, and sets ``b._obs`` (the observations the next rollout
    starts from), ``b.advantages`` and ``b.returns`` ((n_steps, n_envs) float32 on ``b.device``)
    and ``b.rollout`` (its reward statistics: the env's rewards before normalisation; ``steps`` =
    n_steps * n_envs; ``env_seconds``). Leaves ``b.num_timesteps`` to the caller. With an archive
    curriculum (``b.curriculum``) finished episodes are counted by origin and archived states may
    replace reset observations (:mod:`gradlab.learn.ppo_curriculum`). Runs under
    ``torch.no_grad``; with bf16 on a CPU the policy steps run on ``b._rollout_net``, refreshed
    from ``b.net`` first.
    """
    import contextlib

    import torch

    cfg, net = b.cfg, b.net
    gamma = cfg.gamma
    # bf16 autocast in the rollout only on CUDA; on a CPU bf16 runs the rollout on a bf16 copy of
    # the network instead (see setup).
    ctx = (b._autocast if b.device.type == "cuda" else None) or contextlib.nullcontext
    forward, value_fn = b._forward, net.value
    if b._rollout_net is not None:
        with torch.no_grad():
            for copy_p, p in zip(b._rollout_net.parameters(), net.parameters(), strict=True):
                copy_p.copy_(p)
        forward, value_fn = b._rollout_net, b._rollout_net.value
    box = None if net.discrete else (b.action_space.low, b.action_space.high)
    norm = b.normaliser
    # The env's rewards before normalisation, for train/reward/shaped/* (as sb3.ppo reports them).
    raw_rewards = np.zeros((cfg.n_steps, b.venv.num_envs)) if norm is not None else None
    # MLPs: only the action head per step; values and log-probs of the whole rollout come from one
    # batched forward afterwards (the parameters do not change during a rollout). CNNs share the
    # convolutions between the heads, so they take both per step.
    batched = not net.nature_cnn
    obs = b._obs
    env_s = 0.0
    cur = b.curriculum
    # On a CPU the per-step writes go through NumPy views of the rollout tensors (the same memory): a
    # NumPy slice assignment costs a fraction of a torch one, ~15 us less per step for CartPole here.
    views = None
    if b.device.type == "cpu":
        views = {name: getattr(b, name).numpy() for name in ("buf_actions", "buf_rewards", "buf_dones", "buf_boot")}
        views["buf_obs"] = b.buf_obs.numpy() if b.buf_obs.is_contiguous() else None
    if cur is not None:
        cur.begin_rollout()

    def act(t: int, sl: slice) -> np.ndarray:
        """Actions of lanes ``sl`` at step ``t`` (their observations into the rollout tensors)."""
        if views is not None and views["buf_obs"] is not None:
            views["buf_obs"][t, sl] = obs[sl]
        else:
            b.buf_obs[t, sl].copy_(_to_device(b.device, obs[sl]))
        obs_t = b.buf_obs[t, sl]
        with ctx():
            if batched:
                head = b._head(obs_t)
            else:
                head, value = forward(obs_t)
                b.buf_values[t, sl] = value.float()
        actions, logp = sample_actions(net, head)
        if not batched:
            b.buf_logp[t, sl] = logp
        a = actions.cpu().numpy()
        if views is not None:
            views["buf_actions"][t, sl] = a
        else:
            b.buf_actions[t, sl] = actions
        return a if box is None else np.clip(a, box[0], box[1])

    def record(t: int, sl: slice, res: Any) -> np.ndarray:
        """Step ``t``'s result of lanes ``sl``: rewards, ends, the bootstrap of truncated lanes;
        returns the lanes' next observations (normalised when the recipe normalises)."""
        done = res.terminated | res.truncated
        next_obs, reward = res.obs, res.reward
        if norm is not None:  # VecNormalize's order: statistics updated, then applied (all lanes)
            raw_rewards[t] = reward
            next_obs, reward = norm.step(next_obs, reward, done)
        if views is not None:
            views["buf_rewards"][t, sl] = reward
            views["buf_dones"][t, sl] = done
            views["buf_boot"][t, sl] = 0.0
        else:
            b.buf_rewards[t, sl] = _to_device(b.device, reward)
            b.buf_dones[t, sl] = _to_device(b.device, done)
            b.buf_boot[t, sl].zero_()
        if res.episodes:
            truncated = [ep.lane for ep in res.episodes if res.truncated[ep.lane] and not res.terminated[ep.lane]]
            if truncated:
                final = np.stack([res.final_obs[lane] for lane in truncated])
                final = _to_device(b.device, norm.normalize_obs(final) if norm is not None else final)
                with ctx():
                    v = value_fn(final).float()
                b.buf_boot[t, sl][torch.as_tensor(truncated, device=b.device)] = gamma * v
            if cur is None:
                for ep in res.episodes:
                    b.episodes.add(ep.as_json())  # raw and shaped returns: never normalised
        if cur is not None:  # episodes by origin, archived starts and new cells (gradlab.learn.ppo_curriculum)
            cur.after_step(t, sl.start or 0, res, next_obs, b.episodes, norm)
        return next_obs

    groups = getattr(b.venv, "groups", None)
    with torch.no_grad():
        if groups is not None and len(groups) == 2 and b.venv.steps_in_background and norm is None:
            # Two lane groups (gradlab.envs.groups): group a's lanes step while group b's actions
            # are computed, and the other way round. Each lane sees the same sequence as in one env.
            # (Normalisation updates its statistics over all lanes at once: it takes the other path.)
            (ga, gb), (sa, sb) = groups, b.venv.slices
            obs = np.array(obs, copy=True)
            ga.step_async(act(0, sa))
            for t in range(cfg.n_steps):
                actions_b = act(t, sb)
                t0 = time.perf_counter()
                res_a = ga.step_wait()
                env_s += time.perf_counter() - t0
                gb.step_async(actions_b)
                obs[sa] = record(t, sa, res_a)
                if t + 1 < cfg.n_steps:
                    actions_a = act(t + 1, sa)
                t0 = time.perf_counter()
                res_b = gb.step_wait()
                env_s += time.perf_counter() - t0
                if t + 1 < cfg.n_steps:
                    ga.step_async(actions_a)
                obs[sb] = record(t, sb, res_b)
        else:
            everything = slice(None)
            for t in range(cfg.n_steps):
                actions = act(t, everything)
                t0 = time.perf_counter()
                res = b.venv.step(actions)
                env_s += time.perf_counter() - t0
                obs = record(t, everything, res)
        b._obs = obs
        with ctx():
            if batched:
                t_, n_ = b.buf_logp.shape
                head, values = b._forward(b.buf_obs.flatten(0, 1))
                logp, _ = log_prob_entropy(net, head, b.buf_actions.flatten(0, 1))
                b.buf_logp.copy_(logp.view(t_, n_))
                b.buf_values.copy_(values.float().view(t_, n_))
            _, last_values = forward(_to_device(b.device, obs))
        if b.device.type == "cpu":
            # The recursion is 2 x n_steps small operations: NumPy's per-operation cost is a fifth of
            # torch's (0.1 ms against 0.54 ms per CartPole rollout here), with bitwise the same float32
            # results; the arrays share the tensors' memory.
            adv_np, ret_np = compute_gae((b.buf_rewards + b.buf_boot).numpy(), b.buf_values.numpy(),
                                         b.buf_dones.numpy(), last_values.float().numpy(), gamma, cfg.gae_lambda)
            adv, ret = torch.from_numpy(adv_np), torch.from_numpy(ret_np)
        else:
            adv, ret = compute_gae(b.buf_rewards + b.buf_boot, b.buf_values, b.buf_dones,
                                   last_values.float(), gamma, cfg.gae_lambda)
    b.advantages, b.returns = adv, ret
    if cur is not None:
        cur.after_gae(adv)  # raw GAE, before the update normalises advantages per minibatch
    steps = cfg.n_steps * b.venv.num_envs
    b.rollout = RolloutStats(env_seconds=env_s)
    b.rollout.add_rewards(raw_rewards.ravel() if norm is not None else b.buf_rewards.cpu().numpy().ravel())
    b.rollout.steps = steps

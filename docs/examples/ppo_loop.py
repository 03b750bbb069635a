"""A CleanRL-style PPO loop on a gradlab goal through gymnasium's vector API (docs/SHARING.md).

    uv run python docs/examples/ppo_loop.py CartPole-v1 --updates 20

The structure of CleanRL's ppo.py (rollout storage, GAE, clipped surrogate, minibatch epochs) on
``gradlab.make_vector_env``. gradlab autoresets in the same step (``AutoresetMode.SAME_STEP``):
``obs`` after a step is already the next episode's first observation, so a truncated lane
bootstraps from V(``infos["final_obs"]``) and a terminated one from 0.
"""

import argparse

import numpy as np
import torch

import gradlab

parser = argparse.ArgumentParser()
parser.add_argument("goal", nargs="?", default="CartPole-v1")
parser.add_argument("--lanes", type=int, default=4)
parser.add_argument("--steps", type=int, default=64, help="steps per lane per update")
parser.add_argument("--updates", type=int, default=20)
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()
gamma, gae_lambda, clip, epochs, minibatches = 0.99, 0.95, 0.2, 4, 4

torch.manual_seed(args.seed)
torch.set_num_threads(1)  # 64-unit networks: more threads only contend
envs = gradlab.make_vector_env(args.goal, args.lanes, seed=args.seed)
assert envs.metadata["autoreset_mode"].value == "SameStep"
n_obs, n_actions = int(np.prod(envs.single_observation_space.shape)), int(envs.single_action_space.n)


def mlp(out: int, std: float) -> torch.nn.Sequential:
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(n_obs, 64), torch.nn.Tanh(), torch.nn.Linear(64, out))
    torch.nn.init.orthogonal_(net[-1].weight, std)
    return net


actor, critic = mlp(n_actions, 0.01), mlp(1, 1.0)
optimizer = torch.optim.Adam([*actor.parameters(), *critic.parameters()], lr=2.5e-3, eps=1e-5)


def as_tensor(x: np.ndarray) -> torch.Tensor:  # uint8 frames are scaled to [0, 1]
    return torch.as_tensor(x, dtype=torch.float32) / (255.0 if x.dtype == np.uint8 else 1.0)


T, N = args.steps, args.lanes
obs_buf = torch.zeros((T, N, *envs.single_observation_space.shape))
actions, logprobs, rewards, values, next_values, terminated_buf, done_buf = (torch.zeros((T, N)) for _ in range(7))
obs, _ = envs.reset(seed=args.seed)
for update in range(args.updates):
    episode_returns: list[float] = []
    for t in range(T):
        obs_buf[t] = as_tensor(obs)
        with torch.no_grad():
            dist = torch.distributions.Categorical(logits=actor(obs_buf[t]))
            action = dist.sample()
            values[t] = critic(obs_buf[t]).squeeze(1)
        actions[t], logprobs[t] = action, dist.log_prob(action)
        obs, reward, terminated, truncated, info = envs.step(action.numpy())
        rewards[t] = torch.as_tensor(reward)
        terminated_buf[t] = torch.as_tensor(terminated, dtype=torch.float32)
        done_buf[t] = torch.as_tensor(terminated | truncated, dtype=torch.float32)
        with torch.no_grad():  # V(s_{t+1}), from the true final observation where this step ended an episode
            nxt = as_tensor(obs)
            if "final_obs" in info:
                ended = np.flatnonzero(info["_final_obs"])
                nxt[ended] = as_tensor(np.stack(info["final_obs"][ended]))
                episode_returns += info["final_info"]["gradlab_episode"]["return"][ended].tolist()
            next_values[t] = critic(nxt).squeeze(1)
    with torch.no_grad():  # GAE (Schulman et al. 2016, eq. 16), cut at every episode end
        advantages, running = torch.zeros((T, N)), torch.zeros(N)
        for t in reversed(range(T)):
            delta = rewards[t] + gamma * next_values[t] * (1.0 - terminated_buf[t]) - values[t]
            running = delta + gamma * gae_lambda * (1.0 - done_buf[t]) * running
            advantages[t] = running
        returns = advantages + values
    b_obs, b_actions, b_logprobs = obs_buf.reshape(T * N, -1), actions.reshape(-1), logprobs.reshape(-1)
    b_adv, b_returns = advantages.reshape(-1), returns.reshape(-1)
    for _ in range(epochs):
        for mb in torch.randperm(T * N).chunk(minibatches):
            dist = torch.distributions.Categorical(logits=actor(b_obs[mb]))
            ratio = (dist.log_prob(b_actions[mb]) - b_logprobs[mb]).exp()
            adv = (b_adv[mb] - b_adv[mb].mean()) / (b_adv[mb].std() + 1e-8)
            pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip)).mean()
            v_loss = 0.5 * ((critic(b_obs[mb]).squeeze(1) - b_returns[mb]) ** 2).mean()
            loss = pg_loss + 0.5 * v_loss - 0.01 * dist.entropy().mean()
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_([*actor.parameters(), *critic.parameters()], 0.5)
            optimizer.step()
    mean = np.mean(episode_returns) if episode_returns else float("nan")
    print(f"update {update} episodes {len(episode_returns)} return_mean {mean:.2f} v_loss {v_loss.item():.4f}")
envs.close()

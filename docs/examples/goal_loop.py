"""A REINFORCE loop on a gradlab goal through gymnasium's vector API (docs/SHARING.md).

    uv run python docs/examples/goal_loop.py gradlab__bandit --updates 60

The goal supplies the environment, preprocessing and task program; the loop owns the learning.
"""

import argparse

import numpy as np
import torch

import gradlab

parser = argparse.ArgumentParser()
parser.add_argument("goal", nargs="?", default="gradlab__bandit")
parser.add_argument("--lanes", type=int, default=16)
parser.add_argument("--steps", type=int, default=32, help="steps per lane per update")
parser.add_argument("--updates", type=int, default=60)
args = parser.parse_args()

torch.set_num_threads(1)  # a 64-unit network: more threads only contend
envs = gradlab.make_vector_env(args.goal, args.lanes, seed=0)
assert envs.metadata["autoreset_mode"].value == "SameStep"  # obs is already the next episode's first
n_obs, n_actions = int(np.prod(envs.single_observation_space.shape)), int(envs.single_action_space.n)
policy = torch.nn.Sequential(torch.nn.Linear(n_obs, 64), torch.nn.Tanh(), torch.nn.Linear(64, n_actions))
optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
obs, _ = envs.reset(seed=0)
for update in range(args.updates):
    log_probs, rewards, dones, finished, episode_returns = [], [], [], [], []
    for _ in range(args.steps):
        dist = torch.distributions.Categorical(logits=policy(torch.as_tensor(obs, dtype=torch.float32).flatten(1)))
        action = dist.sample()
        obs, reward, terminated, truncated, info = envs.step(action.numpy())
        log_probs.append(dist.log_prob(action))
        rewards.append(torch.as_tensor(reward))
        dones.append(torch.as_tensor(terminated | truncated, dtype=torch.float32))
        if "final_info" in info:
            ended = info["_final_obs"]  # the lanes whose episode ended this step
            episodes = info["final_info"]["gradlab_episode"]  # one (lanes,) array per field
            finished += (episodes["outcome"][ended] == "success").tolist()
            episode_returns += episodes["return"][ended].tolist()
    returns, running = [], torch.zeros(args.lanes)
    for r, d in zip(reversed(rewards), reversed(dones), strict=True):  # return within each episode (no critic: no bootstrap)
        running = r + 0.99 * running * (1.0 - d)
        returns.insert(0, running)
    returns = torch.stack(returns)
    loss = -(torch.stack(log_probs) * (returns - returns.mean())).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if update % 10 == 0 or update == args.updates - 1:
        mean, rate = (np.mean(episode_returns), np.mean(finished)) if finished else (float("nan"),) * 2
        print(f"update {update} episodes {len(finished)} return_mean {mean:.2f} success_rate {rate:.3f}")
envs.close()

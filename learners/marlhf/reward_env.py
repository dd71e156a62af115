"""RewardModelEnv: any registered env with its team reward replaced by a reward model.

MARLHF hands the RL backend a factory of these wrappers, so MAGRPO, the baselines and the
actor-critics train against the frozen reward model without knowing it. The wrapper
delegates everything (reset, observations, ``clone()``, ``state()``, ``num_tasks``,
batched ``step_many``) and only rewrites the step's rewards: every agent gets the reward
model's score of the joint response (the agents' current prompts and actions); the task
reward stays in ``infos[agent]["task_reward"]`` (and ``"task_raw_reward"``), and
``infos[agent]["reward"]`` becomes the score.

Episode ends (termination thresholds) are still decided by the wrapped env on the task
reward. :class:`RewardSwitch` turns the replacement off, e.g. while evaluating, so that
evaluation always reports the task reward.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from pettingzoo.utils.wrappers import BaseParallelWrapper

from comlrl_core.env_api import step_many as _step_many
from comlrl_core.env_api import team_reward
from learners.common.setup import build_env
from learners.preference.candidates import JointCandidate, TaskCandidates


class RewardSwitch:
    """The scorer shared by a wrapper and its clones, and whether it is in use."""

    def __init__(self, score: Callable[[Sequence[tuple[Sequence[str], Sequence[str]]]], list[float]]) -> None:
        self.score = score
        self.enabled = True


class RewardModelEnv(BaseParallelWrapper):
    def __init__(self, env: Any, switch: RewardSwitch) -> None:
        super().__init__(env)
        self.switch = switch
        self.metadata = getattr(env, "metadata", {})
        self._prompts: dict[str, str] = {}

    # -- delegation that BaseParallelWrapper leaves to class attributes ------------------
    @property
    def possible_agents(self) -> list[str]:
        return self.env.possible_agents

    @property
    def agents(self) -> list[str]:
        return self.env.agents

    @property
    def num_tasks(self) -> int:
        return self.env.num_tasks

    def task(self, index: int) -> Any:
        return self.env.task(index)

    def state(self) -> Any:
        return self.env.state()

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, infos = self.env.reset(seed=seed, options=options)
        self._prompts = dict(obs)
        return obs, infos

    def close(self) -> None:
        close = getattr(self.env, "close", None)  # duck-typed envs may have none
        if callable(close):
            close()

    def clone(self) -> "RewardModelEnv":
        copy = RewardModelEnv(self.env.clone(), self.switch)
        copy._prompts = dict(self._prompts)
        return copy

    def step(self, actions: dict[str, str]):
        return RewardModelEnv.step_many([self], [actions])[0]

    def team_reward(self, rewards: dict[str, float]) -> float:
        """The wrapped env's team-reward rule (the contract's, see ``comlrl_core.env_api``)."""
        return team_reward(self.env, rewards)

    @classmethod
    def step_many(cls, envs: Sequence["RewardModelEnv"], actions_list: Sequence[dict[str, str]]) -> list:
        """Step the wrapped envs in one batch, then score every joint action in one call."""
        results = _step_many([e.env for e in envs], actions_list)
        switch = envs[0].switch if envs else None
        if switch is None or not switch.enabled:
            for e, (obs, *_rest) in zip(envs, results, strict=True):
                e._prompts = dict(obs)
            return results
        requests = []
        for e, actions in zip(envs, actions_list, strict=True):
            names = list(e.env.possible_agents)
            requests.append(([e._prompts.get(a, "") for a in names], [str(actions.get(a, "")) for a in names]))
        scores = switch.score(requests)
        out = []
        for e, score, (obs, rewards, terms, truncs, infos) in zip(envs, scores, results, strict=True):
            task_reward = team_reward(e.env, rewards)
            new_infos = {}
            for agent, info in infos.items():
                info = dict(info)
                info["task_reward"] = task_reward
                info["task_raw_reward"] = info.get("raw_reward", task_reward)
                info["reward"] = float(score)
                new_infos[agent] = info
            out.append((obs, {a: float(score) for a in rewards}, terms, truncs, new_infos))
            e._prompts = dict(obs)
        return out


def reward_model_env_factory(env_spec: Any, switch: RewardSwitch) -> Callable[..., RewardModelEnv]:
    """A factory (as the learners accept) of wrapped envs built from ``env_spec``."""

    def make(**kwargs: Any) -> RewardModelEnv:
        return RewardModelEnv(build_env(env_spec, **kwargs), switch)

    return make


class RewardModelOracle:
    """Preference oracle that scores joint responses with a reward model (reward = raw = score)."""

    def __init__(self, score: Callable[[Sequence[tuple[Sequence[str], Sequence[str]]]], list[float]]) -> None:
        self._score = score

    def score(self, requests: Sequence[tuple[TaskCandidates, JointCandidate]]) -> list[tuple[float, float]]:
        values = self._score([(task.prompts, cand.completions) for task, cand in requests])
        return [(float(v), float(v)) for v in values]

"""Every example config in configs/ loads and trains for a step with the tiny model.

Each ``configs/<algorithm>_<env>.yaml`` is read the way ``comlrl train`` reads it
(``<Config>.from_yaml(path, overrides)``), then shrunk with ``key=value`` overrides: the
tiny random model, a few tokens, one or two task items, the process sandbox for
CoopCode. The trainer then runs to the end; the run folder must hold metrics and every
agent's trainable parameters must have moved.

One honest exception: the tiny random model writes no Python, so on CoopCode every joint
action scores 0 in the sandbox. A flat reward gives zero group-relative advantages
(MAGRPO family) and no preference pairs (MADPO, MARLHF), so those runs must end with the
parameters UNCHANGED after scoring every candidate 0; their update paths are exercised by
the Writing configs of the same learners, whose rewards vary. The actor-critics still
move (their critic's value estimate makes the advantage non-zero).
"""

from __future__ import annotations

import pathlib

import pytest
import torch

from comlrl_core.run.metrics import read_metrics
from learners.cli import learner_classes

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
ENV_IDS = {"coopcode": "comlrl/CoopCode-v0", "writing": "comlrl/Writing-v0"}
MAGRPO_FAMILY = ("magrpo", "mareinforce", "marloo", "maremax")
ALGORITHMS = MAGRPO_FAMILY + ("iac", "maac", "madpo", "madpo_iter", "marlhf", "marlhf_iter")

# The same budget for every learner of a family: tiny but enough for one real update.
COMMON = [
    "agent_models=tiny-random",
    "device=cpu",
    "max_new_tokens=8",
    "temperature=1.0",
    "top_p=1.0",
    "top_k=0",
    "eval_interval=0",
    "progress_bar=false",
    "seed=0",
    "agent_learning_rate=1e-3",
]
PREFERENCE = [
    "preference_num_candidates=4",
    "preference_pairs_per_sample=2",
    "preference_max_tasks=2",
    "preference_task_batch_size=2",
    "save_final_checkpoint=false",
]
BUDGETS = {
    **{
        algo: [
            "num_generations=2",
            "num_turns=1",
            "max_steps=1",
            "rollout_buffer_size=1",
            "save_final_checkpoint=false",
        ]
        for algo in MAGRPO_FAMILY
    },
    "iac": ["num_turns=1", "max_steps=1", "rollout_buffer_size=1", "critic_learning_rate=1e-3"],
    "maac": ["num_turns=1", "max_steps=1", "rollout_buffer_size=1", "critic_learning_rate=1e-3"],
    "madpo": PREFERENCE + ["num_train_epochs=1", "train_batch_size=4"],
    "madpo_iter": PREFERENCE + ["num_iterations=1", "num_train_epochs=1", "train_batch_size=4"],
    "marlhf": PREFERENCE + ["reward_num_train_epochs=1", "num_generations=2", "max_steps=1", "rollout_buffer_size=1"],
    "marlhf_iter": PREFERENCE
    + [
        "num_iterations=1",
        "reward_num_train_epochs=1",
        "num_generations=2",
        "max_steps=1",
        "rollout_buffer_size=1",
        "num_train_epochs=1",
    ],
}
# What the tiny run needs from the environment on top of the config's own env_kwargs.
# Learners whose update still moves the actors when every reward is 0 (see the docstring).
MOVES_ON_FLAT_REWARD = ("iac", "maac")
ENV_OVERRIDES = {"coopcode": {"sandbox_backend": "process", "sandbox_timeout": 5.0}, "writing": {}}


def split_name(path: pathlib.Path) -> tuple[str, str]:
    algorithm, env = path.stem.rsplit("_", 1)
    return algorithm, env


def test_one_config_per_learner_and_environment():
    names = {p.stem for p in CONFIGS}
    assert names == {f"{a}_{e}" for a in ALGORITHMS for e in ENV_IDS}
    for path in CONFIGS:
        algorithm, env = split_name(path)
        text = path.read_text()
        # The header says how to run it, and the defaults are the real model with LoRA.
        assert f"comlrl train {algorithm} --env {ENV_IDS[env]} --config configs/{path.name}" in text
        config_cls, _ = learner_classes(algorithm)
        config = config_cls.from_yaml(path)
        assert config.agent_models == ["smollm2-135m-instruct"] and config.lora is True
        assert config.output_dir == f"runs/{path.stem}"


def _trainable(team) -> list[torch.Tensor]:
    return [p.detach().clone() for policy in team for p in policy.parameters() if p.requires_grad]


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_config_trains_with_tiny_model(path, tmp_path):
    from learners.cli import build_team

    algorithm, env = split_name(path)
    config_cls, trainer_cls = learner_classes(algorithm)
    overrides = COMMON + BUDGETS[algorithm] + [f"output_dir={tmp_path / 'run'}"]
    config = config_cls.from_yaml(path, overrides=overrides)
    config = config_cls.from_dict({**config.to_dict(), "env_kwargs": {**config.env_kwargs, **ENV_OVERRIDES[env]}})
    torch.manual_seed(0)
    team = build_team(config, ENV_IDS[env])
    before = _trainable(team)
    trainer = trainer_cls(config, team, ENV_IDS[env])
    try:
        trainer.train()
    finally:
        trainer.env.close()
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert rows and any(k not in ("step", "time") for row in rows for k in row)
    after = _trainable(team)
    if env == "coopcode" and algorithm not in MOVES_ON_FLAT_REWARD:
        rewards = [v for row in rows for k, v in row.items() if k.endswith("reward_mean")]
        assert rewards and all(v == 0.0 for v in rewards), rewards  # scored, and flat
        assert all(torch.equal(a, b) for a, b in zip(before, after))
        return
    per_agent = len(before) // len(team.policies)
    for agent in range(len(team.policies)):
        chunk = slice(agent * per_agent, (agent + 1) * per_agent)
        assert any(not torch.equal(a, b) for a, b in zip(before[chunk], after[chunk])), f"agent {agent} did not move"

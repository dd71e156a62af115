"""The CoMLRL-style constructor (``Trainer.from_components``) and the team-size probe."""

from __future__ import annotations

import pytest
import torch

from comlrl_core.models.tiny import tiny_model_path
from comlrl_core.run.metrics import read_metrics
from learners.catalog import ALGORITHMS, learner_classes
from learners.common.components import DatasetEnvFactory, build_team
from learners.magrpo import MAGRPOConfig, MAGRPOTrainer

# A few rows in the shape of trl-lib/tldr (what CoMLRL's example loads from the hub).
TLDR_ROWS = [
    {"prompt": "SUBREDDIT: r/cooking\nPOST: I burnt the rice again. How do I stop it sticking?", "completion": "x"},
    {"prompt": "SUBREDDIT: r/running\nPOST: My knees hurt after long runs on the road.", "completion": "x"},
    {"prompt": "SUBREDDIT: r/books\nPOST: Looking for a short novel to read on a train ride.", "completion": "x"},
    {"prompt": "SUBREDDIT: r/gardening\nPOST: The tomato leaves turn yellow from the bottom up.", "completion": "x"},
]


def _tldr_dataset(kind: str):
    if kind == "list":
        return list(TLDR_ROWS)
    datasets = pytest.importorskip("datasets", reason="the 'hub' extra (datasets) is not installed")
    return datasets.Dataset.from_list(TLDR_ROWS)


def _params(trainer) -> list[torch.Tensor]:
    return [p.detach().clone() for policy in trainer.policies for p in policy.parameters()]


@pytest.mark.parametrize("dataset_kind", ["list", "datasets"])
def test_comlrl_magrpo_example_port_trains(tmp_path, dataset_kind):
    """CoMLRL's documented MAGRPO example; only the import and the constructor differ
    (offline: the model is the tiny one, the dataset a few tldr-shaped rows)."""
    from transformers import AutoTokenizer

    model_name = tiny_model_path()
    dataset = _tldr_dataset(dataset_kind).select(range(4)) if dataset_kind == "datasets" else _tldr_dataset("list")
    tokenizer = AutoTokenizer.from_pretrained(model_name)
    seen_items = []

    def reward_func(completions1, completions2, batch_items=None):
        # the expansion (agent 2) should be about twice as long as the summary (agent 1)
        seen_items.extend(batch_items)
        rewards = []
        for c1, c2 in zip(completions1, completions2, strict=True):
            ratio = (len(c2) + 1) / (len(c1) + 1)
            rewards.append(max(0.0, 1.0 - abs(ratio - 2.0) / 2.0))
        return rewards

    def summary_formatter(example):
        return f"Summarize the post in one sentence.\n{example['prompt']}\nTL;DR:"

    def expansion_formatter(example):
        return f"Explain the post in detail.\n{example['prompt']}\nExplanation:"

    configs = MAGRPOConfig(
        num_agents=2,
        num_generations=4,
        max_new_tokens=8,
        num_turns=1,
        max_steps=4,
        rollout_buffer_size=1,
        agent_learning_rate=1e-3,
        temperature=1.0,
        top_p=1.0,
        eval_interval=0,
        progress_bar=False,
        save_final_checkpoint=False,
        output_dir=str(tmp_path / "run"),
    )
    trainer = MAGRPOTrainer.from_components(
        agent_model=model_name,
        num_agents=2,
        tokenizer=tokenizer,
        train_dataset=dataset,
        reward_func=reward_func,
        formatters=[summary_formatter, expansion_formatter],
        args=configs,
    )
    before = _params(trainer)
    trainer.train()

    assert any(not torch.equal(a, b) for a, b in zip(before, _params(trainer), strict=True)), "no parameter moved"
    rewards = [row["turn_1/reward_mean"] for row in read_metrics(tmp_path / "run") if "turn_1/reward_mean" in row]
    assert len(rewards) == 4 and all(0.0 <= r <= 1.0 for r in rewards)
    assert seen_items and all(item["prompt"] in {r["prompt"] for r in TLDR_ROWS} for item in seen_items)
    assert trainer.config.agent_models == [model_name] and trainer.config.num_agents == 2


def _reward(completions1, completions2, batch_items=None):
    return [float(len(a) > len(b)) for a, b in zip(completions1, completions2, strict=True)]


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_every_learner_builds_from_components(tmp_path, algorithm):
    config_cls, trainer_cls = learner_classes(algorithm)
    trainer = trainer_cls.from_components(
        agent_model="tiny-random",
        train_dataset=TLDR_ROWS,
        reward_func=_reward,
        formatters=[lambda x: x["prompt"], lambda x: "Reply: " + x["prompt"]],
        args=config_cls(output_dir=str(tmp_path / algorithm)),
    )
    assert isinstance(trainer, trainer_cls)
    assert trainer.agent_names == ["agent_0", "agent_1"] and len(trainer.policies) == 2
    assert trainer.num_tasks == len(TLDR_ROWS)
    obs, _ = trainer.env.reset(options={"task": 0})
    assert obs["agent_1"] == "Reply: " + TLDR_ROWS[0]["prompt"]


def test_eval_dataset_is_the_evaluation_split(tmp_path):
    rows = [{"prompt": f"item {i}"} for i in range(5)]
    trainer = MAGRPOTrainer.from_components(
        agent_model="tiny-random",
        train_dataset=rows[:3],
        eval_dataset=rows[3:],
        reward_func=_reward,
        args=MAGRPOConfig(output_dir=str(tmp_path / "run")),
    )
    assert (trainer.config.train_task_slice, trainer.config.eval_task_slice) == ("0:3", "3:")
    assert trainer.num_tasks == 3
    eval_env = trainer._make_env(trainer.config.eval_task_slice)
    assert [eval_env.task(i)["prompt"] for i in range(eval_env.num_tasks)] == ["item 3", "item 4"]
    with pytest.raises(ValueError, match="give one or the other"):
        MAGRPOTrainer.from_components(
            agent_model="tiny-random",
            train_dataset=rows[:3],
            eval_dataset=rows[3:],
            reward_func=_reward,
            args=MAGRPOConfig(output_dir=str(tmp_path / "run2"), train_task_slice=":2"),
        )


def test_transformers_model_objects_and_a_tokenizer(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tiny_model_path()
    models = [AutoModelForCausalLM.from_pretrained(path) for _ in range(2)]
    trainer = MAGRPOTrainer.from_components(
        agents=models,
        tokenizer=AutoTokenizer.from_pretrained(path),
        train_dataset=TLDR_ROWS,
        reward_func=_reward,
        args=MAGRPOConfig(output_dir=str(tmp_path / "run")),
    )
    assert [p.model for p in trainer.policies] == models
    with pytest.raises(ValueError, match="pass tokenizer"):
        MAGRPOTrainer.from_components(agents=models, train_dataset=TLDR_ROWS, reward_func=_reward)


def test_from_components_errors_name_the_fix(tmp_path):
    from learners.actor_critic import IACTrainer

    kw = dict(train_dataset=TLDR_ROWS, reward_func=_reward)
    with pytest.raises(ValueError, match="not both"):
        MAGRPOTrainer.from_components(agents=["tiny-random"] * 2, agent_model="tiny-random", **kw)
    with pytest.raises(ValueError, match="team sizes disagree"):
        MAGRPOTrainer.from_components(agent_model="tiny-random", num_agents=3, formatters=[str, str], **kw)
    with pytest.raises(TypeError, match="args must be a IACConfig"):
        IACTrainer.from_components(agent_model="tiny-random", args=MAGRPOConfig(), **kw)


def test_a_tokenizer_that_is_not_the_models_is_refused(tmp_path):
    class OtherTokenizer:
        def get_vocab(self):
            return {"a": 0, "b": 1}

    with pytest.raises(ValueError, match="does not match agent 0"):
        MAGRPOTrainer.from_components(
            agent_model="tiny-random",
            tokenizer=OtherTokenizer(),
            train_dataset=TLDR_ROWS,
            reward_func=_reward,
            args=MAGRPOConfig(output_dir=str(tmp_path / "run")),
        )


def test_components_given_twice_are_refused():
    factory = DatasetEnvFactory({"dataset": TLDR_ROWS, "reward_func": _reward})
    with pytest.raises(ValueError, match=r"\['reward_func'\] given both"):
        factory(reward_func=_reward)


# -- the team-size probe ------------------------------------------------------------------
def test_team_size_probe_builds_the_env_with_its_env_kwargs():
    config = MAGRPOConfig(
        agent_models=["tiny-random"],
        env_kwargs={"dataset": TLDR_ROWS, "reward_func": f"{__name__}:_reward", "num_agents": 3},
    )
    team = build_team(config, "comlrl/Dataset-v0")
    assert len(team) == 3


def test_team_size_probe_single_agent_coop_code():
    """The issue's case: ``env_kwargs: {agents: single}`` is a one-agent team, not two."""
    config = MAGRPOConfig(
        agent_models=["tiny-random"],
        env_kwargs={"agents": "single", "dataset": "humaneval", "sandbox_backend": "process"},
    )
    assert len(build_team(config, "comlrl/CoopCode-v0")) == 1


def test_multi_turn_with_a_comlrl_external_transition_trains(tmp_path):
    seen = []

    def external_transition(prompt, agent_completions, num_agents):
        seen.append(list(agent_completions))
        return [f"{prompt}\nYour last answer: {c}\nImprove it." for c in agent_completions]

    trainer = MAGRPOTrainer.from_components(
        agent_model="tiny-random",
        train_dataset=TLDR_ROWS,
        reward_func=_reward,
        external_transition=external_transition,
        args=MAGRPOConfig(
            num_turns=2,
            num_generations=2,
            max_new_tokens=4,
            max_steps=1,
            eval_interval=0,
            progress_bar=False,
            save_final_checkpoint=False,
            output_dir=str(tmp_path / "run"),
        ),
    )
    trainer.train()
    assert len(seen) == 2 and all(len(c) == 2 for c in seen)  # one transition per turn-1 joint action
    rows = read_metrics(tmp_path / "run")
    assert any("turn_2/reward_mean" in r for r in rows)


def test_the_dataset_env_from_the_command_line(tmp_path):
    from comlrl_core.cli import main as cli_main

    data = tmp_path / "rows.jsonl"
    data.write_text("".join(f'{{"prompt": "Say a word about {w}."}}\n' for w in ("rain", "snow", "sun")))
    out = tmp_path / "run"
    rc = cli_main(
        [
            "train",
            "magrpo",
            "--env",
            "comlrl/Dataset-v0",
            f"output_dir={out}",
            f"env_kwargs={{dataset: '{data}', reward_func: '{__name__}:_reward'}}",
            "num_turns=1",
            "num_generations=2",
            "max_new_tokens=4",
            "max_steps=2",
            "eval_interval=0",
            "progress_bar=false",
        ]
    )
    assert rc == 0
    assert len([r for r in read_metrics(out) if "turn_1/reward_mean" in r]) == 2


@pytest.mark.parametrize("checkpointing", [False, True])
def test_gradient_checkpointing_option_reaches_every_agent(checkpointing):
    from comlrl_core.models.lora import is_checkpointing

    config = MAGRPOConfig(agent_models=["tiny-random"], num_agents=2, lora=True, gradient_checkpointing=checkpointing)
    team = build_team(config, "comlrl/Writing-v0")
    assert [is_checkpointing(p.model) for p in team] == [checkpointing, checkpointing]


def test_the_configs_seed_draws_the_teams_new_adapters():
    """comlrl train / comlrl main build the team here: its LoRA adapters must come from the
    run's seed, not from torch's per-process random state (a seeded run repeats)."""

    def adapters(seed: int, global_seed: int) -> list[torch.Tensor]:
        torch.manual_seed(global_seed)
        config = MAGRPOConfig(agent_models=["tiny-random"], num_agents=2, lora=True, seed=seed)
        team = build_team(config, "comlrl/Writing-v0")
        return [p.detach().clone() for policy in team for n, p in policy.named_parameters() if "lora_A" in n]

    first, again, other = adapters(7, 1), adapters(7, 2), adapters(8, 1)
    assert first and all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(first, other, strict=True))

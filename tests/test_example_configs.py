"""Every example config in configs/ loads and trains for a step with the tiny model.

Each ``configs/<algorithm>_<env>.yaml`` is read the way ``comlrl train`` reads it
(``<Config>.from_yaml(path, overrides)``), then shrunk with ``key=value`` overrides: the
tiny random model, a few tokens, one or two task items, the process sandbox for
CoopCode. The trainer then runs to the end; the run folder must hold metrics and every
agent's trainable parameters must have moved.

The tiny random model writes no Python, so on CoopCode every joint action it samples would
score 0 in the sandbox: a flat reward, zero group-relative advantages and no preference
pairs. The CoopCode runs therefore sample from :class:`ScriptedCoder`: each agent's tiny
model still scores (and learns) every completion, but the text is scripted per role --
either the task's reference solution split into ``aux`` plus a ``main`` that calls it, or
a wrong answer -- drawn per completion from the sampling seed and never the same kind for
every completion of a prompt. Rewards are then non-zero and vary within every group, and
every CoopCode config must move every agent's parameters like the Writing ones.
"""

from __future__ import annotations

import ast
import pathlib
import random
import re
from typing import Sequence

import pytest
import torch

from comlrl_core.policy import Completion, GenerationConfig
from comlrl_core.run.metrics import read_metrics
from envs.code.program import reference_solution
from envs.code.tasks import load_tasks
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
    **{
        algo: ["num_turns=1", "num_generations=2", "max_steps=1", "rollout_buffer_size=1", "critic_learning_rate=1e-3"]
        for algo in ("iac", "maac")
    },
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
ENV_OVERRIDES = {"coopcode": {"sandbox_backend": "process", "sandbox_timeout": 5.0}, "writing": {}}


class _Rename(ast.NodeTransformer):
    """Rename a function and every use of its name (recursive calls included)."""

    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:  # noqa: N802
        if node.name == self.old:
            node.name = self.new
        self.generic_visit(node)
        return node

    def visit_Name(self, node: ast.Name) -> ast.Name:  # noqa: N802
        if node.id == self.old:
            node.id = self.new
        return node


class ScriptedCoder:
    """A CoopCode ``generate`` for a trainable policy: scripted text, the policy's own tokens.

    The role (helper ``aux`` or ``main``) and the entry point are read from the prompt. A
    right answer is the task's reference solution renamed to ``aux`` (helper) or a ``main``
    that returns ``aux(*args)``; a wrong one is an empty ``pass`` (helper) or a ``main``
    that returns None. Whether a completion is right is drawn from the seed, and when a
    prompt gets several completions both kinds occur, so the rewards of every group vary.
    """

    _ENTRY = re.compile(r"(?:Write the function|Your teammate will write) `([A-Za-z_][A-Za-z0-9_]*)`")

    def __init__(self, policy, references: dict[str, str]) -> None:
        self.policy = policy
        self.references = references
        self.kinds: list[bool] = []  # every completion's kind (True: right), for the test

    def text(self, prompt: str, right: bool) -> str:
        match = self._ENTRY.search(prompt)
        assert match, prompt
        entry = match.group(1)
        if "helper agent" in prompt:
            if not right:
                return "pass\n"
            return ast.unparse(_Rename(entry, "aux").visit(ast.parse(self.references[entry]))) + "\n"
        body = "return aux(*args)" if right else "return None"
        return f"def {entry}(*args):\n    {body}\n"

    def __call__(
        self,
        prompts: Sequence[str],
        num_samples: int = 1,
        generation_config: GenerationConfig | None = None,
        seed: int | Sequence[int] | None = None,
    ) -> list[list[Completion]]:
        rng = random.Random(repr(seed))
        policy, out = self.policy, []
        for prompt in prompts:
            kinds = [rng.random() < 0.5 for _ in range(num_samples)]
            if num_samples > 1 and len(set(kinds)) == 1:
                kinds[-1] = not kinds[-1]
            self.kinds.extend(kinds)
            prompt_ids = policy.encode_prompt(prompt)
            group = []
            for right in kinds:
                text = self.text(prompt, right)
                ids = list(policy.tokenizer(text, add_special_tokens=False)["input_ids"]) + [policy.eos_token_ids[0]]
                group.append(Completion(text=text, token_ids=ids, finish_reason="eos", prompt_token_ids=prompt_ids))
            out.append(group)
        return out


def humaneval_references() -> dict[str, str]:
    """Entry point -> reference solution of every HumanEval task that has one."""
    refs = {}
    for task in load_tasks("humaneval"):
        code = reference_solution(task)
        if code is not None:
            refs.setdefault(task["entry_point"], code)
    return refs


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
    scripts = []
    if env == "coopcode":
        references = humaneval_references()
        for policy in team.policies:
            policy.generate = ScriptedCoder(policy, references)
            scripts.append(policy.generate)
    before = _trainable(team)
    trainer = trainer_cls(config, team, ENV_IDS[env])
    try:
        trainer.train()
    finally:
        trainer.env.close()
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert rows and any(k not in ("step", "time") for row in rows for k in row)
    after = _trainable(team)
    if env == "coopcode":
        assert all(True in s.kinds and False in s.kinds for s in scripts)  # right and wrong code
        rewards = [v for row in rows for k, v in row.items() if k.endswith("reward_mean")]
        assert rewards and any(v > 0 for v in rewards), rewards  # the sandbox passed some code
    per_agent = len(before) // len(team.policies)
    for agent in range(len(team.policies)):
        chunk = slice(agent * per_agent, (agent + 1) * per_agent)
        assert any(not torch.equal(a, b) for a, b in zip(before[chunk], after[chunk], strict=True)), (
            f"agent {agent} did not move"
        )

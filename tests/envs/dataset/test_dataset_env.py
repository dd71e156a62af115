"""Dataset-v0: rows, CoMLRL formatters, CoMLRL reward functions and transitions, multi-turn."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import envs
from envs.dataset import DatasetEnv, load_rows, resolve_callable

ROWS = [
    {"prompt": "Write about rivers.", "word": "river"},
    {"prompt": "Write about winter.", "word": "winter"},
    {"prompt": "Write about lanterns.", "word": "lantern"},
]


def mention_reward(completions1, completions2, batch_items=None):
    """1 per agent whose completion mentions the item's word (CoMLRL's signature)."""
    return [
        float(item["word"] in c1) + float(item["word"] in c2)
        for c1, c2, item in zip(completions1, completions2, batch_items, strict=True)
    ]


def f_writer(item):
    return f"Writer: {item['prompt']}"


def f_critic(item):
    return f"Critic: mention {item['word']}."


def _env(**kw):
    base = dict(dataset=ROWS, reward_func=mention_reward, formatters=[f_writer, f_critic])
    base.update(kw)
    return DatasetEnv(**base)


def test_turn_one_prompts_are_the_formatters_of_the_item():
    env = _env()
    obs, infos = env.reset(options={"task": 1})
    assert env.possible_agents == ["agent_0", "agent_1"]
    assert obs == {"agent_0": "Writer: Write about winter.", "agent_1": "Critic: mention winter."}
    assert infos["agent_0"]["task_index"] == 1
    assert env.num_tasks == 3


def test_without_formatters_every_agent_sees_the_prompt_field():
    env = DatasetEnv(dataset=ROWS, reward_func=mention_reward, num_agents=3, agent_names=["a", "b", "c"])
    obs, _ = env.reset(options={"task": 0})
    assert obs == {a: "Write about rivers." for a in ("a", "b", "c")}
    with pytest.raises(KeyError, match="no 'prompt' field"):
        DatasetEnv(dataset=[{"text": "x"}], reward_func=mention_reward).reset(options={"task": 0})


def test_reward_func_is_called_as_comlrl_calls_it():
    calls = []

    def reward(c1, c2, batch_items=None):
        calls.append((list(c1), list(c2), list(batch_items)))
        return [0.5]

    env = _env(reward_func=reward, reward_processor={"scale": 2.0, "shift": 1.0})
    env.reset(options={"task": 2})
    _, rewards, _, truncations, infos = env.step({"agent_0": "one", "agent_1": "two"})
    assert calls == [(["one"], ["two"], [ROWS[2]])]
    assert rewards == {"agent_0": 2.0, "agent_1": 2.0}
    assert infos["agent_0"]["raw_reward"] == 0.5
    assert truncations == {"agent_0": True, "agent_1": True}


def test_reward_func_without_batch_items_and_a_scalar_return():
    env = _env(reward_func=lambda c1, c2: len(c1[0]) + len(c2[0]))
    env.reset(options={"task": 0})
    _, rewards, *_ = env.step({"agent_0": "abc", "agent_1": "de"})
    assert rewards["agent_0"] == 5.0


def test_batched_reward_scores_a_batched_step_in_one_call():
    calls = []

    def reward(c1, c2, batch_items=None):
        calls.append(len(c1))
        return mention_reward(c1, c2, batch_items)

    env = _env(reward_func=reward, batched_reward=True)
    env.reset(options={"task": 0})
    clones = [env.clone() for _ in range(4)]
    actions = [{"agent_0": "a river" if i % 2 else "nothing", "agent_1": "river"} for i in range(4)]
    results = DatasetEnv.step_many(clones, actions)
    assert calls == [4]
    assert [r[1]["agent_0"] for r in results] == [1.0, 2.0, 1.0, 2.0]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.text(max_size=30), st.text(max_size=30)), min_size=1, max_size=6))
def test_batched_and_per_item_rewards_agree(pairs):
    per_item, batched = _env(), _env(batched_reward=True)
    scored = []
    for env in (per_item, batched):
        env.reset(options={"task": 0})
        clones = [env.clone() for _ in pairs]
        results = DatasetEnv.step_many(clones, [{"agent_0": a, "agent_1": b} for a, b in pairs])
        scored.append([r[1]["agent_0"] for r in results])
    assert scored[0] == scored[1]


def test_bad_reward_returns_are_clear_errors():
    env = _env(reward_func=lambda c1, c2, batch_items=None: [1.0, 2.0])
    env.reset(options={"task": 0})
    with pytest.raises(ValueError, match="returned 2 values for 1 joint completion"):
        env.step({"agent_0": "x", "agent_1": "y"})
    env = _env(reward_func=lambda c1, c2: ["high"])
    env.reset(options={"task": 0})
    with pytest.raises(TypeError, match="must return numbers"):
        env.step({"agent_0": "x", "agent_1": "y"})


def test_non_finite_reward_becomes_zero_with_a_diagnostic():
    env = _env(reward_func=lambda c1, c2: [float("nan")])
    env.reset(options={"task": 0})
    _, rewards, _, _, infos = env.step({"agent_0": "x", "agent_1": "y"})
    assert rewards["agent_0"] == 0.0
    assert any("non-finite" in d for d in infos["agent_0"]["diagnostics"])


def test_garbage_actions_are_scored_not_raised():
    env = _env()
    env.reset(options={"task": 0})
    _, rewards, *_ = env.step({"agent_0": None, "agent_1": b"\xff\xfe river"})
    assert rewards["agent_0"] == 1.0  # the bytes decode with replacement and still mention "river"


def test_comlrl_three_argument_transition_and_multi_turn():
    seen = []

    def transition(prompt, agent_completions, num_agents):
        seen.append((prompt, list(agent_completions), num_agents))
        return [f"Revise for {prompt!r}: {c}" for c in agent_completions]

    env = _env(external_transition=transition, num_turns=2)
    env.reset(options={"task": 0})
    obs, rewards, terminations, truncations, _ = env.step({"agent_0": "first", "agent_1": "second"})
    assert seen == [("Write about rivers.", ["first", "second"], 2)]
    assert obs == {
        "agent_0": "Revise for 'Write about rivers.': first",
        "agent_1": "Revise for 'Write about rivers.': second",
    }
    assert not any(truncations.values()) and not any(terminations.values())
    _, _, _, truncations, infos = env.step({"agent_0": "river", "agent_1": "river"})
    assert all(truncations.values()) and infos["agent_0"]["turn"] == 2


def test_transition_with_histories_and_formatters_taking_external_prompts():
    def transition(
        prompt, agent_completions, num_agents, prompt_history_per_agent=None, response_history_per_agent=None
    ):
        return [f"{len(prompt_history_per_agent[i])}|{response_history_per_agent[i][-1]}" for i in range(num_agents)]

    def f_wrapping(item, external_prompts=None):
        return f"[{item['word']}] " + (external_prompts if external_prompts is not None else item["prompt"])

    env = _env(formatters=[f_wrapping, f_critic], external_transition=transition, num_turns=3)
    obs, _ = env.reset(options={"task": 0})
    assert obs["agent_0"] == "[river] Write about rivers."
    obs, *_ = env.step({"agent_0": "a", "agent_1": "b"})
    assert obs == {"agent_0": "[river] 1|a", "agent_1": "1|b"}  # the critic's formatter takes no prompts
    obs, *_ = env.step({"agent_0": "c", "agent_1": "d"})
    assert obs == {"agent_0": "[river] 2|c", "agent_1": "2|d"}


def test_plain_transition_and_early_termination():
    env = _env(num_turns=3, early_termination_threshold=2.0)
    env.reset(options={"task": 0})
    obs, _, terminations, _, _ = env.step({"agent_0": "no", "agent_1": "river"})
    assert not any(terminations.values())
    assert (
        obs["agent_0"].startswith("Writer: Write about rivers.")
        and "Latest response of agent_1:\nriver" in obs["agent_0"]
    )
    _, _, terminations, _, _ = env.step({"agent_0": "river", "agent_1": "river"})
    assert all(terminations.values()) and env.agents == []


def test_construction_errors_name_the_fix():
    with pytest.raises(ValueError, match="dataset is empty"):
        _env(dataset=[])
    with pytest.raises(TypeError, match=r"dataset\['train'\]"):
        _env(dataset={"train": ROWS})
    with pytest.raises(ValueError, match="num_agents=3 but formatters names 2"):
        _env(num_agents=3)
    with pytest.raises(ValueError, match="agent_names must be 2 distinct"):
        _env(agent_names=["x", "x"])
    with pytest.raises(TypeError, match="dataset item 1 is a str"):
        load_rows([{"prompt": "a"}, "b"])


def test_rows_from_json_and_jsonl_files(tmp_path):
    as_json, as_jsonl = tmp_path / "rows.json", tmp_path / "rows.jsonl"
    as_json.write_text(json.dumps(ROWS))
    as_jsonl.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    assert load_rows(str(as_json)) == ROWS == load_rows(as_jsonl)
    with pytest.raises(FileNotFoundError):
        load_rows(str(tmp_path / "missing.json"))


class FakeHFDataset:
    """What DatasetEnv relies on in a datasets.Dataset: len, iteration over row dicts."""

    def __init__(self, rows):
        self._rows = rows

    def __len__(self):
        return len(self._rows)

    def __iter__(self):
        return iter(dict(r) for r in self._rows)

    def __getitem__(self, i):
        return dict(self._rows[i])


def test_a_dataset_object_is_read_by_duck_typing():
    env = _env(dataset=FakeHFDataset(ROWS))
    assert env.num_tasks == 3 and env.task(2)["word"] == "lantern"


def test_a_real_datasets_dataset():
    datasets = pytest.importorskip("datasets", reason="the 'hub' extra (datasets) is not installed")
    env = _env(dataset=datasets.Dataset.from_list(ROWS))
    obs, _ = env.reset(options={"task": 1})
    assert obs["agent_1"] == "Critic: mention winter."


def test_callables_named_by_import_text_for_yaml_configs():
    env = envs.make(
        "comlrl/Dataset-v0",
        dataset=ROWS,
        reward_func=f"{__name__}:mention_reward",
        formatters=[f"{__name__}:f_writer", f"{__name__}:f_critic"],
        task_slice="1:",
    )
    assert env.num_tasks == 2
    obs, _ = env.reset(options={"task": 0})
    assert obs["agent_0"] == "Writer: Write about winter."
    assert resolve_callable("json:dumps", "x") is json.dumps
    with pytest.raises(ValueError, match="has no attribute"):
        resolve_callable("json:nope", "reward_func")
    with pytest.raises(ValueError, match="package.module:function"):
        resolve_callable("json", "reward_func")

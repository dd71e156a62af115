"""JointRewardModel: padding-side invariance, Bradley-Terry fitting, and the env wrapper."""

from __future__ import annotations

import pytest
import torch
from preference_fakes import CountingEnv, clear_preference

from comlrl_core.env_api import step_many
from learners.marlhf import JointRewardModel, RewardModelEnv, RewardSwitch, bradley_terry_loss, joint_text
from learners.marlhf.reward_model import last_real_token_index


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return JointRewardModel.from_source("tiny-random", device="cpu")


def test_last_real_token_index_either_side():
    left = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    right = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]])
    assert last_real_token_index(left).tolist() == [3, 3]
    assert last_real_token_index(right).tolist() == [1, 2]


def test_scores_do_not_depend_on_padding_side(model):
    texts = ["short", joint_text(["a long prompt here", "p2"], ["resp one", "resp two"])]
    tok = model.tokenizer
    scores = {}
    for side in ("left", "right"):
        tok.padding_side = side
        with torch.no_grad():
            scores[side] = model.score_texts(texts)
    alone = torch.stack([model.score_texts([t])[0] for t in texts]).detach()
    assert torch.allclose(scores["left"], scores["right"], atol=1e-4)
    assert torch.allclose(scores["left"], alone, atol=1e-4)


def test_bradley_terry_loss_exact():
    value = bradley_terry_loss(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 2.0]))
    expected = (
        -torch.nn.functional.logsigmoid(torch.tensor(1.0)) - torch.nn.functional.logsigmoid(torch.tensor(-2.0))
    ) / 2
    assert value.item() == pytest.approx(expected.item(), rel=1e-6)


def test_fit_learns_the_preference(model):
    torch.manual_seed(1)
    rm = JointRewardModel.from_source("tiny-random", device="cpu")
    pairs = [clear_preference(i) for i in range(6)]

    def margin():
        w = rm.score_joint([(p.prompts, p.winner_completions) for p in pairs])
        lose = rm.score_joint([(p.prompts, p.loser_completions) for p in pairs])
        return sum(a - b for a, b in zip(w, lose, strict=True)) / len(pairs)

    before = margin()
    result = rm.fit(pairs, epochs=8, batch_size=3, learning_rate=1e-3, seed=0)
    assert result.accuracy == 1.0 and result.steps == 16
    assert margin() > before + 1.0
    held_out = clear_preference(9)
    w, lose = rm.score_joint(
        [(held_out.prompts, held_out.winner_completions), (held_out.prompts, held_out.loser_completions)]
    )
    assert w > lose


def test_wrapper_replaces_the_team_reward_and_keeps_the_task_reward():
    calls = []

    def score(items):
        calls.append(len(items))
        return [float(len(c[0])) for _, c in items]

    switch = RewardSwitch(score)
    base = CountingEnv(reward_fn=lambda t, a, turn: 0.25, num_tasks=2)
    env = RewardModelEnv(base, switch)
    obs, _ = env.reset(options={"task": 1})
    assert env.possible_agents == ["a0", "a1"] and env.num_tasks == 2 and env.agents == ["a0", "a1"]
    clones = [env.clone(), env.clone()]
    results = step_many(clones, [{"a0": "abc", "a1": "x"}, {"a0": "abcdef", "a1": "y"}])
    assert calls == [2]  # one scoring call for the batch
    assert [r[1]["a0"] for r in results] == [3.0, 6.0] and results[0][1]["a1"] == 3.0
    assert results[0][4]["a0"]["task_reward"] == 0.25 and results[0][4]["a0"]["reward"] == 3.0
    assert isinstance(env.state(), str)
    switch.enabled = False
    env.reset(options={"task": 0})
    assert env.step({"a0": "abc", "a1": "x"})[1]["a0"] == 0.25  # switched off: the task reward


def test_a_truncated_joint_text_keeps_its_responses(model):
    """Over max_length the START of the joint text goes, so two joint responses to the same
    (long) prompts still score differently; cutting the end would score the prompts alone."""
    prompts = [" ".join(["passage"] * 60), "expand it"]
    texts = [joint_text(prompts, ["first answer", "alpha"]), joint_text(prompts, ["second reply", "omega"])]
    full = len(model.tokenizer(texts[0])["input_ids"])
    model.max_length = 16
    try:
        assert full > 16
        enc = model.encode(texts)
        assert enc["input_ids"].shape[1] == 16
        kept = model.tokenizer.decode(enc["input_ids"][0])
        assert "alpha" in kept and "passage" not in kept
        with torch.no_grad():
            scores = model.score_texts(texts)
        assert not torch.isclose(scores[0], scores[1])
        assert model.tokenizer.truncation_side == "right"  # the shared tokenizer is left as it was
    finally:
        model.max_length = None

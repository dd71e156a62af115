"""Centralized MADPO: one actor writes every role in one tagged response; the oracle scores
the parsed roles and the DPO margin is the actor's over the whole response."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from preference_fakes import FakeTeam, TextBigram, a_fraction, env_factory

from comlrl_core.config.options import ConfigError
from learners.madpo import MADPOConfig, MADPOIterConfig, MADPOTrainer


class TaggedBigram(TextBigram):
    """Writes its sampled letters as two role sections (the first two letters are agent 0's);
    responses whose first letter is 'e' leave agent 1's section out, those starting with 'd'
    carry no section at all. Token ids stay the sampled ones: the whole response."""

    def generate(self, prompts, num_samples=1, generation_config=None, seed=None):
        self.seen_prompts = list(prompts)
        groups = super().generate(prompts, num_samples, generation_config, seed)
        for group in groups:
            for k, c in enumerate(group):
                text = c.text
                if text.startswith("d"):
                    tagged = text
                elif text.startswith("e"):
                    tagged = f"<agent_0>{text}</agent_0>"
                else:
                    tagged = f"<agent_0>{text[:2]}</agent_0><agent_1>{text[2:]}</agent_1>"
                group[k] = dataclasses.replace(c, text=tagged)
        return groups


def _config(tmp_path, **kw):
    base = dict(
        generation_mode="centralized",
        preference_num_candidates=6,
        preference_pairs_per_sample=3,
        max_new_tokens=5,
        temperature=1.0,
        top_p=1.0,
        top_k=None,
        num_train_epochs=2,
        train_batch_size=2,
        eval_interval=0,
        eval_num_samples=2,
        agent_learning_rate=0.1,
        output_dir=str(tmp_path / "run"),
        progress_bar=False,
        seed=4,
    )
    base.update(kw)
    return MADPOConfig(**base)


def test_one_actor_writes_every_role_and_trains_on_the_whole_response(tmp_path):
    actor = TaggedBigram(init_seed=1)
    before = actor.logits.detach().clone()
    cfg = _config(tmp_path, eval_interval=1000)  # evaluations at the start and the end
    trainer = MADPOTrainer(cfg, FakeTeam([actor]), env_factory(a_fraction))  # a team of one
    assert trainer.agent_names == ["a0", "a1"]
    pairs, _ = trainer.collect_pairs()
    assert pairs
    # the actor saw every role's prompt in one centralized prompt with the tag format
    assert all("task" in p and "<agent_0>" in p and "<agent_1>" in p for p in actor.seen_prompts)
    for pair in pairs:
        assert pair.prompts[0].startswith("task") and len(pair.winner_completions) == 2  # role-level record
        assert pair.winner_reward > pair.loser_reward
        assert pair.winner_reward == pytest.approx(
            a_fraction(0, dict(zip("xy", pair.winner_completions, strict=True)), 0)
        )
        # one sequence: the actor's whole response, scored against its centralized prompt
        assert len(pair.prompt_ids) == 1 and len(pair.winner_ids) == 1
        assert len(pair.winner_ids[0]) > len(pair.winner_completions[0])
    trainer.pairs = None
    trainer.train()
    assert not torch.equal(before, actor.logits)
    rows = [h for h in trainer.history if "preference/centralized_dropped" in h]
    assert rows and rows[0]["preference/centralized_dropped"] >= 0
    assert any("agent_0/margin" in h for h in trainer.history)
    evals = [h for h in trainer.history if "eval/turn_1/reward_mean" in h]
    assert evals and 0.0 <= evals[-1]["eval/turn_1/reward_mean"] <= 1.0


def test_only_the_actor_of_a_full_team_trains(tmp_path):
    other, actor = TextBigram(init_seed=2), TaggedBigram(init_seed=3)
    frozen = other.logits.detach().clone()
    trainer = MADPOTrainer(
        _config(tmp_path, centralized_agent_index=1, num_train_epochs=1),
        FakeTeam([other, actor]),
        env_factory(a_fraction),
    )
    trainer.train()
    assert len(trainer.optimizers) == 1 and trainer.trained_policies == [actor]
    assert torch.equal(frozen, other.logits) and other.generate_calls == []
    assert any("agent_1/margin" in h for h in trainer.history)


def test_partial_and_sectionless_responses_are_counted(tmp_path):
    actor = TaggedBigram(init_seed=5)
    trainer = MADPOTrainer(_config(tmp_path, preference_num_candidates=40), FakeTeam([actor]), env_factory(a_fraction))
    trainer.collect_pairs()
    assert trainer.parse_counts.dropped > 0 and trainer.parse_counts.partial > 0


def test_centralized_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="generation_mode"):
        MADPOIterConfig(generation_mode="centralized")
    with pytest.raises(ConfigError, match="centralized_agent_index"):
        MADPOConfig(centralized_agent_index=-1)
    with pytest.raises(ValueError, match="centralized_agent_index"):
        MADPOTrainer(_config(tmp_path, centralized_agent_index=3), FakeTeam([TaggedBigram()]), env_factory(a_fraction))

"""IAC / MAAC trainers on comlrl/Writing-v0 with the tiny model: when updates happen,
what each critic reads, multi-turn episodes, checkpoints."""

from __future__ import annotations

import pytest
import torch

from learners.actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer, ModelCritic, ValueHeadCritic
from learners.actor_critic.ac_trainer import UpdateRecord

from .conftest import ENV, base_options


def _count_steps(optimizer, counter: list[int]) -> None:
    original = optimizer.step

    def step(*args, **kwargs):
        counter.append(1)
        return original(*args, **kwargs)

    optimizer.step = step


def test_updates_run_when_the_buffer_fills_and_the_epoch_remainder_is_flushed(team, tmp_path):
    cfg = IACConfig(
        **base_options(
            tmp_path,
            num_generations=2,
            rollout_buffer_size=3,
            use_separate_critic=False,
            train_task_slice=":3",
            num_train_epochs=2,
            max_new_tokens=2,
        )
    )
    trainer = IACTrainer(cfg, team, ENV)
    steps: list[int] = []
    _count_steps(trainer.actor_optimizers[0], steps)
    trainer.train()
    # 2 episodes per task item, 3 items per epoch: the buffer (3) is full after item 2, the
    # epoch's remaining 2 episodes are flushed after item 3 (never carried into epoch 2).
    assert trainer.update_log == [
        UpdateRecord(2, 4, 4, "buffer_full"),
        UpdateRecord(3, 6, 2, "epoch_end"),
        UpdateRecord(5, 10, 4, "buffer_full"),
        UpdateRecord(6, 12, 2, "epoch_end"),
    ]
    assert trainer.episodes_collected == 12 and len(trainer.buffer) == 0
    # train_batch_size=None: one optimizer step per update round (single turn)
    assert len(steps) == 4


def test_train_batch_size_sets_optimizer_steps_per_round(team, tmp_path):
    cfg = MAACConfig(
        **base_options(
            tmp_path,
            num_generations=4,
            rollout_buffer_size=4,
            train_batch_size=3,
            train_task_slice=":2",
            max_new_tokens=2,
        )
    )
    trainer = MAACTrainer(cfg, team, ENV)
    actor, critic = [], []
    _count_steps(trainer.actor_optimizers[1], actor)
    _count_steps(trainer.critic_optimizers[0], critic)
    trainer.train()
    assert [r.num_episodes for r in trainer.update_log] == [4, 4]
    assert len(actor) == len(critic) == 4  # ceil(4 / 3) = 2 steps per round, 2 rounds


def test_multi_turn_policy_never_updates_between_turns(team, tmp_path):
    cfg = IACConfig(
        **base_options(
            tmp_path,
            num_turns=3,
            rollout_buffer_size=1,
            use_separate_critic=False,
            train_task_slice=":2",
            max_new_tokens=2,
        )
    )
    trainer = IACTrainer(cfg, team, ENV)
    seen: list[tuple[int, int]] = []  # (task item, update rounds so far) at every generate call
    for policy in trainer.policies:
        original = policy.generate

        def generate(*args, _original=original, **kwargs):
            seen.append((trainer.global_step, trainer.update_rounds))
            return _original(*args, **kwargs)

        policy.generate = generate
    trainer.train()
    for step in range(2):
        rounds = {r for s, r in seen if s == step}
        assert rounds == {step}, "the policy changed between the turns of one episode"
        assert sum(1 for s, _ in seen if s == step) == 3 * 2  # 3 turns x 2 agents, 1 call each
    assert [r.global_step for r in trainer.update_log] == [1, 2]


def test_early_terminated_episodes_are_short_and_flagged(team, tmp_path):
    cfg = MAACConfig(
        **base_options(
            tmp_path,
            num_turns=3,
            early_termination_threshold=0.0,
            rollout_buffer_size=5,
            train_task_slice=":3",
            max_new_tokens=2,
        )
    )
    trainer = MAACTrainer(cfg, team, ENV)
    trainer.train_step()
    (episode,) = list(trainer.buffer)
    assert len(episode) == 1 and episode.terminated


def _record_critic_inputs(trainer) -> list[list[tuple[str, str | None]]]:
    calls: list[list[tuple[str, str | None]]] = [[] for _ in trainer.critics]
    for k, critic in enumerate(trainer.critics):
        original = critic.encode

        def encode(history, action=None, _k=k, _original=original):
            calls[_k].append((history, action))
            return _original(history, action)

        critic.encode = encode
    return calls


def _capture_update_episodes(trainer) -> list:
    captured = []
    original_update = trainer._update

    def update(episodes, rng):
        captured.extend(episodes)
        return original_update(episodes, rng)

    trainer._update = update
    return captured


@pytest.mark.parametrize("critic_type", ["v", "q"])
def test_iac_critic_reads_only_its_own_agents_text(team, tmp_path, critic_type):
    cfg = IACConfig(
        **base_options(
            tmp_path,
            rollout_buffer_size=2,
            critic_type=critic_type,
            env_kwargs={},
            use_separate_critic=False,
            max_steps=2,
            max_new_tokens=4,
        )
    )
    trainer = IACTrainer(cfg, team, ENV)
    calls = _record_critic_inputs(trainer)
    captured = _capture_update_episodes(trainer)
    trainer.train()
    assert len(captured) == 2
    for agent, (mine, other) in enumerate([("summarizer", "expander"), ("expander", "summarizer")]):
        assert len(calls[agent]) == 2
        for (history, action), episode in zip(calls[agent], captured, strict=True):
            own = episode.turns[0].agents[agent]
            assert history == own.prompt
            assert f"You are the {mine}" in history and f"You are the {other}" not in history
            assert action == (own.completion if critic_type == "q" else None)


@pytest.mark.parametrize("critic_type", ["v", "q"])
def test_maac_critic_reads_every_agents_text(team, tmp_path, critic_type):
    cfg = MAACConfig(
        **base_options(
            tmp_path,
            rollout_buffer_size=1,
            critic_type=critic_type,
            env_kwargs={},
            max_steps=1,
            max_new_tokens=4,
            num_generations=2 if critic_type == "q" else 1,
        )
    )
    trainer = MAACTrainer(cfg, team, ENV)
    calls = _record_critic_inputs(trainer)
    captured = _capture_update_episodes(trainer)
    trainer.train()
    assert len(calls[0]) == len(captured) >= 1
    for (history, action), episode in zip(calls[0], captured, strict=True):
        turn = episode.turns[0]
        assert "You are the summarizer" in history and "You are the expander" in history
        assert turn.agents[0].prompt in history and turn.agents[1].prompt in history
        if critic_type == "v":
            assert action is None
        else:
            assert turn.agents[0].completion in action and turn.agents[1].completion in action
            assert "## summarizer action" in action and "## expander action" in action


def test_iac_critic_input_excludes_the_teammates_completion(team, tmp_path):
    cfg = IACConfig(**base_options(tmp_path, critic_type="q", use_separate_critic=False, max_steps=2))
    trainer = IACTrainer(cfg, team, ENV)
    trainer.train_step()
    (episode,) = list(trainer.buffer)
    turn = episode.turns[0]
    assert trainer.critic_input(turn, 0) == (turn.agents[0].prompt, turn.agents[0].completion)
    assert trainer.critic_input(turn, 1) == (turn.agents[1].prompt, turn.agents[1].completion)


def test_critic_kinds_follow_use_separate_critic(team, tmp_path):
    head = IACTrainer(IACConfig(**base_options(tmp_path, use_separate_critic=False)), team, ENV)
    assert all(isinstance(c, ValueHeadCritic) for c in head.critics)
    assert [c.backbone for c in head.critics] == head.policies
    sep = IACTrainer(IACConfig(**base_options(tmp_path, use_separate_critic=True)), team, ENV)
    assert all(isinstance(c, ModelCritic) for c in sep.critics)
    assert sep.critics[0].backbone.model is not sep.critics[1].backbone.model
    assert len(sep.critic_optimizers) == 2  # one per critic
    with pytest.raises(ValueError, match="use_separate_critic=True wants a separate critic"):
        IACTrainer(IACConfig(**base_options(tmp_path)), team, ENV, critics=head.critics)
    with pytest.raises(ValueError, match="exactly one centralized critic"):
        MAACTrainer(MAACConfig(**base_options(tmp_path)), team, ENV, critics=sep.critics)


def test_team_must_fit_the_env(team, tmp_path):
    with pytest.raises(ValueError, match="2 agents"):
        IACTrainer(IACConfig(**base_options(tmp_path, use_separate_critic=False)), [team[0]], ENV)


def _weights(trainer) -> list[torch.Tensor]:
    out = [p.detach().clone() for p in trainer.policies[0].parameters()]
    out += [p.detach().clone() for c in trainer.critics for p in c.trainable_parameters()]
    return out


def test_resume_equals_uninterrupted(tmp_path):
    from comlrl_core.models.agent_spec import AgentSpec
    from comlrl_core.models.team import Team

    from .conftest import AGENTS

    def fresh(run: str) -> IACTrainer:
        torch.manual_seed(0)
        t = Team.from_specs([AgentSpec(model="tiny-random", device="cpu") for _ in AGENTS])
        cfg = IACConfig(
            **base_options(
                tmp_path / run,
                rollout_buffer_size=3,
                num_generations=2,
                use_separate_critic=True,
                train_task_slice=":4",
                max_new_tokens=2,
            )
        )
        return IACTrainer(cfg, t, ENV)

    straight = fresh("a")
    straight.train()
    paused = fresh("b")
    paused.train(stop_after=3)  # the buffer holds 2 episodes here
    assert len(paused.buffer) == 2
    path = paused.save_checkpoint()
    resumed = fresh("b")
    resumed.resume_from_checkpoint(path)
    assert len(resumed.buffer) == 2 and resumed.global_step == 3
    resumed.train()
    assert resumed.update_log == [r for r in straight.update_log if r.global_step > 3]
    for a, b in zip(_weights(straight), _weights(resumed), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("separate", [False, True])
def test_new_critics_are_drawn_from_the_configs_seed(team, tmp_path, separate):
    """Value heads are new weights: the same config seed gives the same critics whatever
    torch's global random state (a fresh process seeds it from the OS)."""

    def critic_weights(global_seed: int, seed: int) -> list[torch.Tensor]:
        torch.manual_seed(global_seed)
        cfg = IACConfig(**base_options(tmp_path, use_separate_critic=separate, seed=seed))
        trainer = IACTrainer(cfg, team, ENV)
        return [p.detach().clone() for c in trainer.critics for p in c.trainable_parameters()]

    first, again, other = critic_weights(1, 0), critic_weights(2, 0), critic_weights(1, 5)
    assert first and all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(first, other, strict=True))

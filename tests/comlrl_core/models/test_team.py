"""Team: shared LoRA bases, per-agent parameters and gradients, mixed teams, persistence."""

from __future__ import annotations

import pytest
import torch

from comlrl_core.models.hf_policy import TransformersPolicy
from comlrl_core.models.simple_policies import CallablePolicy
from comlrl_core.models.team import AgentSpec, Team
from comlrl_core.policy import GenerationConfig, Policy

P, C = [[1, 2, 3], [9, 8]], [[4, 5, 6], [7, 10, 11]]


def _lora_team(tiny_path, n=2, **kw):
    torch.manual_seed(0)
    return Team.from_specs([AgentSpec(tiny_path, lora=True, lora_r=4, device="cpu", **kw) for _ in range(n)])


def _perturb_lora_b(team, scale=0.02):
    """LoRA starts as the identity (B = 0); give each agent a distinct non-zero B."""
    with torch.no_grad():
        for i, policy in enumerate(team):
            for n, p in policy.named_parameters():
                if "lora_B" in n:
                    p.copy_(scale * (i + 1) * torch.randn(p.shape, generator=torch.Generator().manual_seed(i)))


def _scores(policy):
    with torch.no_grad():
        return policy.sequence_logprobs(P, C)


def test_lora_agents_share_one_base(tiny_path):
    team = _lora_team(tiny_path, n=3)
    assert len(team) == 3 and team.shared_groups == [[0, 1, 2]]
    assert team[0].model is team[1].model is team[2].model
    assert team.policies[2] is team[2]
    assert team[1].adapter_name == "agent_1"
    # the base weights exist once: as many base parameters as one plain model has
    plain = TransformersPolicy.from_source(tiny_path, device="cpu")
    base_numel = sum(p.numel() for n, p in team[0].model.named_parameters() if "lora_" not in n)
    assert base_numel == sum(p.numel() for p in plain.model.parameters())


def test_each_agent_owns_only_its_adapter(tiny_path):
    team = _lora_team(tiny_path)
    params = [team.trainable_parameters(i) for i in range(2)]
    assert params[0] and len(params[0]) == len(params[1])
    assert not {id(p) for p in params[0]} & {id(p) for p in params[1]}
    for i in range(2):
        names = [n for n, _ in team[i].named_parameters()]
        assert all(f".agent_{i}." in n and "lora_" in n for n in names)


def test_gradients_reach_exactly_the_agent_that_ran(tiny_path):
    team = _lora_team(tiny_path)
    (-team[0].sequence_logprobs(P, C).sum()).backward()
    assert all(p.grad is not None for n, p in team[0].named_parameters() if "lora_B" in n)
    assert all(p.grad is None for p in team.trainable_parameters(1))
    assert all(p.grad is None for n, p in team[0].model.named_parameters() if "lora_" not in n)


def test_activating_another_agent_does_not_freeze_the_first(tiny_path):
    team = _lora_team(tiny_path)
    _scores(team[0])
    _scores(team[1])  # peft's set_adapter would set agent_0's requires_grad=False here
    assert all(p.requires_grad for p in team.trainable_parameters(0))
    assert all(p.requires_grad for p in team.trainable_parameters(1))


def test_updating_agent0_leaves_agent1_unchanged(tiny_path):
    team = _lora_team(tiny_path)
    _perturb_lora_b(team)
    before = [_scores(team[i]) for i in range(2)]
    assert not torch.allclose(before[0], before[1])  # the two adapters really differ
    opt0 = torch.optim.SGD([p for p in team.trainable_parameters(0) if p.requires_grad], lr=0.1)
    assert len(opt0.param_groups[0]["params"]) == len(team.trainable_parameters(0))

    (-team[0].sequence_logprobs(P, C).sum()).backward()
    _scores(team[1])  # another agent runs between agent 0's backward and its step
    team[1].generate(["hi"], 1, GenerationConfig(max_new_tokens=2), seed=0)
    opt0.step()

    after = [_scores(team[i]) for i in range(2)]
    assert (after[0] > before[0]).all()  # agent 0 moved towards the trained completions
    assert torch.equal(after[1], before[1])  # agent 1 bit-for-bit unchanged
    assert all(p.grad is None for p in team.trainable_parameters(1))


def test_interleaved_agents_with_gradient_checkpointing(tiny_path, monkeypatch):
    """Checkpointed layers recompute in backward: they must use the adapter of the forward."""
    team = _lora_team(tiny_path, gradient_checkpointing=True).train()
    _perturb_lora_b(team)
    calls = []
    for layer in team[0].model.get_base_model().model.layers:
        original = layer.mlp.forward  # bound: the lean SwiGLU's instance forward

        def counting_forward(*args, _original=original, **kwargs):  # module hooks do not fire on recompute
            calls.append(1)
            return _original(*args, **kwargs)

        monkeypatch.setattr(layer.mlp, "forward", counting_forward)

    (-team[0].sequence_logprobs(P, C).sum()).backward()
    alone = [p.grad.clone() for p in team.trainable_parameters(0)]
    assert len(calls) == 4  # 2 layers x (forward + recomputation): checkpointing is really on
    team[0].model.zero_grad(set_to_none=True)

    loss0 = -team[0].sequence_logprobs(P, C).sum()
    loss1 = -team[1].sequence_logprobs(P, C).sum()  # agent 1 is active when loss0 backprops
    loss0.backward()
    interleaved = [p.grad for p in team.trainable_parameters(0)]
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(alone, interleaved, strict=True))
    assert all(p.grad is None for p in team.trainable_parameters(1))
    loss1.backward()
    assert all(p.grad is not None for n, p in team[1].named_parameters() if "lora_B" in n)


def test_separate_copies_when_not_shareable(tiny_path):
    team = Team.from_specs(
        [
            AgentSpec(tiny_path, lora=True, device="cpu"),
            AgentSpec(tiny_path, lora=True, device="cpu", share_base=False),
            AgentSpec(tiny_path, lora=True, device="cpu", dtype="bf16"),
            AgentSpec(tiny_path, lora=False, device="cpu"),
        ]
    )
    assert team.shared_groups == []
    assert len({id(p.model) for p in team}) == 4
    assert team[3].is_lora is False
    assert len(team.trainable_parameters(3)) == len(list(team[3].model.parameters()))


def test_mixed_team_with_callables_and_policies(tiny_path):
    echo = CallablePolicy(lambda prompt: prompt.upper(), name="shout")
    team = Team.from_specs(["tiny-random", echo, lambda prompt: "fixed"])
    assert len(team) == 3
    assert isinstance(team[0], TransformersPolicy) and team[1] is echo
    assert isinstance(team[2], Policy) and not team[2].trainable
    assert team[2].generate(["q"], 2)[0][0].text == "fixed"
    assert team.trainable_parameters(1) == [] and team.trainable_parameters(2) == []
    assert team.names[1] == "shout"


def test_team_save_load(tiny_path, tmp_path):
    team = _lora_team(tiny_path)
    _perturb_lora_b(team)
    scores = [_scores(p) for p in team]
    team.save(str(tmp_path))
    fresh = _lora_team(tiny_path)
    assert not torch.allclose(_scores(fresh[1]), scores[1])
    fresh.load(str(tmp_path))
    assert all(torch.allclose(_scores(fresh[i]), scores[i], atol=1e-6) for i in range(2))


def test_team_errors(tiny_path):
    with pytest.raises(ValueError, match="at least one agent"):
        Team([])
    with pytest.raises(TypeError, match="from_specs"):
        Team([AgentSpec(tiny_path)])
    with pytest.raises(TypeError, match="list of agents"):
        Team.from_specs(AgentSpec(tiny_path))
    with pytest.raises(TypeError, match="agent 1"):
        Team.from_specs([AgentSpec(tiny_path), 3])
    with pytest.raises(ValueError, match="gradient_checkpointing"):
        Team.from_specs(
            [
                AgentSpec(tiny_path, lora=True, device="cpu"),
                AgentSpec(tiny_path, lora=True, device="cpu", gradient_checkpointing=True),
            ]
        )


@pytest.mark.parametrize(
    "kwargs, option",
    [
        ({"model": ""}, "model"),
        ({"lora_r": 0}, "lora_r"),
        ({"lora_r": 2.5}, "lora_r"),
        ({"lora_alpha": 0}, "lora_alpha"),
        ({"lora_dropout": 1.0}, "lora_dropout"),
        ({"lora_target_modules": []}, "lora_target_modules"),
        ({"dtype": "fp16"}, "dtype"),
        ({"device": "tpu:x"}, "device"),
        ({"lora": "yes"}, "lora"),
        ({"system_prompt": 3}, "system_prompt"),
    ],
)
def test_agent_spec_validation(kwargs, option):
    args = {"model": "tiny-random", **kwargs}
    with pytest.raises(ValueError, match=f"AgentSpec.{option} "):
        AgentSpec(**args)


def test_agent_spec_normalises():
    spec = AgentSpec("tiny-random", dtype="bfloat16", lora_target_modules="q_proj")
    assert spec.dtype == "bf16" and spec.torch_dtype == torch.bfloat16
    assert spec.lora_target_modules == ["q_proj"]
    assert spec.resolved_device() == ("cuda:0" if torch.cuda.is_available() else "cpu")


def test_activate_is_the_contract_switch_for_direct_model_calls(tiny_path):
    # learners that call policy.model themselves (grouped scoring, critics) switch with the
    # public Policy.activate(); the shared base then runs that agent's adapter
    team = _lora_team(tiny_path)
    _perturb_lora_b(team)
    ids = torch.tensor([[5, 6, 7, 8]])
    logits = []
    for agent in (team[0], team[1], team[0]):
        agent.activate()
        assert agent.shared_base.active_adapter == agent.adapter_name
        with torch.no_grad():
            logits.append(agent.model(input_ids=ids).logits)
    assert not torch.allclose(logits[0], logits[1]) and torch.equal(logits[0], logits[2])
    assert CallablePolicy(lambda prompt: prompt, name="echo").activate() is None  # nothing to switch


def _lora_weights(team) -> list[dict[str, torch.Tensor]]:
    return [{n: p.detach().clone() for n, p in policy.named_parameters() if "lora_" in n} for policy in team]


def test_a_seed_builds_the_same_adapters_whatever_the_global_random_state(tiny_path):
    """torch seeds a fresh process from the OS; a team built with a seed must not depend on it."""
    specs = [AgentSpec(tiny_path, lora=True, lora_r=4, device="cpu") for _ in range(2)]
    torch.manual_seed(1)
    first = _lora_weights(Team.from_specs(specs, seed=5))
    torch.manual_seed(2)
    torch.rand(10)
    state = torch.random.get_rng_state()
    second = _lora_weights(Team.from_specs(specs, seed=5))
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's stream is untouched
    for a, b in zip(first, second, strict=True):
        assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
    # the A matrices are drawn (B starts at zero): per agent, and per seed
    a_0 = [w for n, w in first[0].items() if "lora_A" in n]
    a_1 = [w for n, w in first[1].items() if "lora_A" in n]
    assert a_0 and not any(torch.equal(x, y) for x, y in zip(a_0, a_1, strict=True))
    third = _lora_weights(Team.from_specs(specs, seed=6))
    assert not any(torch.equal(first[0][n], third[0][n]) for n in first[0] if "lora_A" in n)


def test_without_a_seed_the_adapters_follow_the_global_random_state(tiny_path):
    specs = [AgentSpec(tiny_path, lora=True, lora_r=4, device="cpu")]
    torch.manual_seed(1)
    first = _lora_weights(Team.from_specs(specs))[0]
    torch.manual_seed(1)
    same = _lora_weights(Team.from_specs(specs))[0]
    torch.manual_seed(2)
    other = _lora_weights(Team.from_specs(specs))[0]
    assert all(torch.equal(first[n], same[n]) for n in first)
    assert not all(torch.equal(first[n], other[n]) for n in first)


def test_an_unshared_agent_is_seeded_too(tiny_path):
    specs = [AgentSpec(tiny_path, lora=True, lora_r=4, device="cpu", share_base=False)]
    torch.manual_seed(1)
    first = _lora_weights(Team.from_specs(specs, seed=3))[0]
    torch.manual_seed(2)
    second = _lora_weights(Team.from_specs(specs, seed=3))[0]
    assert first and all(torch.equal(first[n], second[n]) for n in first)

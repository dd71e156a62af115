"""Tree sizes (env steps, generate calls, leaves) for aligned and cross joint modes."""

from __future__ import annotations

import pytest
from magrpo_fakes import CountingEnv, ScriptedPolicy

from comlrl_core.policy import GenerationConfig
from learners.magrpo.tree import build_tree, joint_indices

G = 3


def _build(num_agents, joint_mode, num_turns, threshold=None, reward_fn=None):
    agents = [f"a{i}" for i in range(num_agents)]
    env = CountingEnv(num_turns=num_turns, early_termination_threshold=threshold, reward_fn=reward_fn, agents=agents)
    obs, _ = env.reset(options={"task": 0})
    policies = [ScriptedPolicy() for _ in agents]
    tree = build_tree(
        env,
        [obs[a] for a in agents],
        policies,
        agents,
        num_generations=G,
        num_turns=num_turns,
        joint_mode=joint_mode,
        generation_config=GenerationConfig(max_new_tokens=4),
        seed=1,
    )
    return tree, env.counter, policies


def test_joint_indices():
    assert joint_indices(2, 2, "aligned") == [(0, 0), (1, 1)]
    assert joint_indices(2, 2, "cross") == [(0, 0), (0, 1), (1, 0), (1, 1)]
    with pytest.raises(ValueError, match="joint_mode"):
        joint_indices(2, 2, "diagonal")


@pytest.mark.parametrize("num_turns", [1, 2, 3])
@pytest.mark.parametrize("num_agents", [1, 2, 3])
@pytest.mark.parametrize("joint_mode", ["aligned", "cross"])
def test_full_tree_sizes(joint_mode, num_agents, num_turns):
    tree, counter, policies = _build(num_agents, joint_mode, num_turns)
    per_node = G if joint_mode == "aligned" else G**num_agents
    expected_steps = sum(per_node**t for t in range(1, num_turns + 1))
    assert tree.env_steps == counter["steps"] == expected_steps
    assert len(tree.leaves()) == per_node**num_turns  # G^T aligned, G^(N*T) cross
    # One batched generate call per agent per level, with every node prompt of the level.
    assert counter["batches"] == num_turns  # one step_many batch per level
    assert tree.generate_calls == num_agents * num_turns
    for policy in policies:
        assert policy.generate_calls == [(per_node**t, G) for t in range(num_turns)]
    # Each joint action stepped its own clone.
    assert counter["clones"] == expected_steps


@pytest.mark.parametrize("num_turns", [1, 2, 3])
@pytest.mark.parametrize("joint_mode", ["aligned", "cross"])
def test_early_termination_sizes(joint_mode, num_turns):
    # Agent a0 answering "0" scores 1.0 >= threshold: that branch stops.
    tree, counter, _ = _build(
        2, joint_mode, num_turns, threshold=1.0, reward_fn=lambda task, acts, turn: float(acts["a0"] == "0")
    )
    per_node = G if joint_mode == "aligned" else G**2
    continuing = per_node - (1 if joint_mode == "aligned" else G)
    expected = sum(per_node * continuing ** (t - 1) for t in range(1, num_turns + 1))
    assert tree.env_steps == counter["steps"] == expected
    assert tree.generate_calls == 2 * num_turns
    terminal = [j for j in tree.leaves() if j.done and j.reward == 1.0]
    assert len(terminal) == sum((per_node - continuing) * continuing ** (t - 1) for t in range(1, num_turns + 1))


def test_tree_stops_when_every_branch_terminates():
    tree, counter, _ = _build(2, "aligned", 3, threshold=0.0, reward_fn=lambda task, acts, turn: 0.0)
    assert tree.env_steps == G and len(tree.levels) == 1 and tree.generate_calls == 2


def test_children_see_their_own_branch():
    tree, _, _ = _build(2, "cross", 2)
    for joint in tree.root.joints:
        a, b = joint.indices
        assert joint.child.prompts == [f"task0 turn2 a0 prev={a}", f"task0 turn2 a1 prev={b}"]


def _tree_record(tree):
    """What a tree holds: per level, each node's prompts, completions and joint rewards."""
    return [
        [
            (
                node.prompts,
                [[c.token_ids for c in comps] for comps in node.completions],
                [j.reward for j in node.joints],
            )
            for node in level
        ]
        for level in tree.levels
    ]


@pytest.mark.parametrize("threshold", [None, 0.5])
def test_a_forest_is_the_trees_built_alone(threshold):
    # bigram policies sample with per-completion seeds: each tree of the forest must be the
    # tree build_tree makes from its root alone, although the forest samples them together
    from magrpo_fakes import BigramPolicy

    from learners.magrpo.tree import TreeRoot, build_forest

    def reward(task, actions, turn):
        return float(len(actions["a0"]) % 3 == task % 3) + 0.1 * turn

    kw = dict(
        num_generations=2, num_turns=3, joint_mode="aligned", generation_config=GenerationConfig(max_new_tokens=5)
    )
    agents = ["a0", "a1"]
    roots, alone, counter = [], [], {"steps": 0, "batches": 0, "clones": 0, "resets": 0}
    for task, seed in [(0, 11), (1, 12), (2, 13)]:
        env = CountingEnv(num_turns=3, early_termination_threshold=threshold, reward_fn=reward, counter=counter)
        obs, _ = env.reset(options={"task": task})
        roots.append(TreeRoot(env.clone(), [obs[a] for a in agents], seed))
        alone.append(
            build_tree(
                env,
                [obs[a] for a in agents],
                [BigramPolicy(init_seed=0), BigramPolicy(init_seed=1)],
                agents,
                seed=seed,
                **kw,
            )
        )
    policies = [BigramPolicy(init_seed=0), BigramPolicy(init_seed=1)]
    batches_before = counter["batches"]
    forest = build_forest(roots, policies, agents, **kw)
    assert [_tree_record(t) for t in forest] == [_tree_record(t) for t in alone]
    assert [(t.env_steps, len(t.leaves())) for t in forest] == [(t.env_steps, len(t.leaves())) for t in alone]
    # one sampling call per agent per level and one env batch per level, for all three trees
    levels = max(len(t.levels) for t in forest)
    assert len(policies[0].generate_calls) == levels and counter["batches"] - batches_before == levels
    assert policies[0].generate_calls[0] == (3, 2)

"""MAGRPO rollout tree, built one level (turn) at a time.

At each node every agent samples ``G = num_generations`` responses to its prompt. The
responses form joint actions:

* ``aligned``: the g-th response of every agent -> G joint actions per node;
* ``cross``: the Cartesian product -> G**N joint actions per node.

Each joint action steps its own ``clone()`` of the node's environment (the environment
scores it and builds the next prompts: the external transition) and, unless the episode
ended (early termination, truncation) or ``num_turns`` is reached, becomes a child node.

Speed: all nodes of a level are handled together -- one ``Policy.generate`` call per
agent per level (every node prompt of the level, ``num_samples=G``), and agents that are
adapters of one shared LoRA base sample that level in the same forward passes
(:func:`comlrl_core.models.joint_generation.generate_together`); then one ``step_many``
call per level (one sandbox batch for code environments).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Sequence

from comlrl_core.env_api import episode_over, step_many, team_reward
from comlrl_core.models.joint_generation import GenerationRequest, generate_together
from comlrl_core.policy import Completion, GenerationConfig, Policy
from learners.common.seeding import derive_seed

JOINT_MODES = ("aligned", "cross")


@dataclass
class JointAction:
    """One joint action of a node: which response of each agent, and what it led to."""

    indices: tuple[int, ...]
    reward: float = 0.0
    done: bool = False
    child: "TreeNode | None" = None
    ret: float = 0.0  # filled by compute_returns
    levels: dict[str, float] = field(default_factory=dict)  # the step's infos["levels"] numbers (logged)


def _info_levels(infos: Any) -> dict[str, float]:
    """The numbers under ``levels`` of the first agent's info (e.g. CoopCode's reward levels)."""
    for info in (infos or {}).values():
        levels = info.get("levels") if isinstance(info, dict) else None
        if isinstance(levels, dict):
            return {str(k): float(v) for k, v in levels.items() if isinstance(v, (int, float))}
    return {}


@dataclass
class TreeNode:
    """A state of the episode (one env clone) at a given turn (1-based)."""

    turn: int
    prompts: list[str]
    env: Any = None
    completions: list[list[Completion]] = field(default_factory=list)  # [agent][g]
    joints: list[JointAction] = field(default_factory=list)


@dataclass
class RolloutTree:
    root: TreeNode
    levels: list[list[TreeNode]]
    env_steps: int = 0
    generate_calls: int = 0
    reward_hacks: int = 0  # env steps whose infos flag a reward hack (e.g. CoopCode's "always_equal")

    def nodes(self) -> list[TreeNode]:
        return [node for level in self.levels for node in level]

    def leaves(self) -> list[JointAction]:
        """Joint actions that end a branch (terminal or at the last turn)."""
        return [j for node in self.nodes() for j in node.joints if j.child is None]


def joint_indices(num_agents: int, num_generations: int, joint_mode: str) -> list[tuple[int, ...]]:
    """Per-agent response indices of each joint action of one node."""
    if joint_mode == "aligned":
        return [(g,) * num_agents for g in range(num_generations)]
    if joint_mode == "cross":
        return list(itertools.product(range(num_generations), repeat=num_agents))
    raise ValueError(f"joint_mode must be one of {JOINT_MODES}, got {joint_mode!r}")


def build_tree(
    env: Any,
    prompts: Sequence[str],
    policies: Sequence[Policy],
    agent_names: Sequence[str],
    *,
    num_generations: int,
    num_turns: int,
    joint_mode: str = "aligned",
    generation_config: GenerationConfig | None = None,
    seed: int = 0,
    keep_envs: bool = False,
) -> RolloutTree:
    """Expand the tree from ``env`` (already reset) whose turn-1 prompts are ``prompts``.

    ``seed`` makes generation reproducible: completion ``k`` (node-major) of level ``t``,
    agent ``i`` samples with its own seed ``derive_seed(seed, t, i, k)``, so it does not
    depend on what else shares its batch. Node envs are dropped once stepped unless
    ``keep_envs``.
    """
    (tree,) = build_forest(
        [TreeRoot(env, prompts, seed)],
        policies,
        agent_names,
        num_generations=num_generations,
        num_turns=num_turns,
        joint_mode=joint_mode,
        generation_config=generation_config,
        keep_envs=keep_envs,
    )
    return tree


@dataclass(frozen=True)
class TreeRoot:
    """Where one tree of a forest starts: a reset env, its turn-1 prompts (one per agent)
    and the tree's seed."""

    env: Any
    prompts: Sequence[str]
    seed: int


def build_forest(
    roots: Sequence[TreeRoot],
    policies: Sequence[Policy],
    agent_names: Sequence[str],
    *,
    num_generations: int,
    num_turns: int,
    joint_mode: str = "aligned",
    generation_config: GenerationConfig | None = None,
    keep_envs: bool = False,
) -> list[RolloutTree]:
    """Expand one tree per root, level by level, all trees together: every node of a
    level, in every tree, goes into the same sampling calls and the same ``step_many``.

    Each tree is exactly the one :func:`build_tree` builds from its root alone: every
    completion keeps its own seed (``derive_seed(root.seed, turn, agent, k)``, k counted
    within its tree), and every joint action steps its own env clone.
    """
    n = len(policies)
    if n != len(agent_names) or any(len(r.prompts) != n for r in roots):
        raise ValueError(
            f"build_tree needs one policy and one prompt per agent: {n} policies, "
            f"{len(agent_names)} agent names, {[len(r.prompts) for r in roots]} prompts"
        )
    if num_generations < 1 or num_turns < 1:
        raise ValueError("num_generations and num_turns must be >= 1")
    combos = joint_indices(n, num_generations, joint_mode)
    config = generation_config or GenerationConfig()
    trees = []
    for r in roots:
        root = TreeNode(turn=1, prompts=list(r.prompts), env=r.env)
        trees.append(RolloutTree(root=root, levels=[]))
    levels = [[tree.root] for tree in trees]  # the current level of each tree (empty: done)
    for turn in range(1, num_turns + 1):
        live = [(tree, level, root.seed) for tree, level, root in zip(trees, levels, roots, strict=True) if level]
        if not live:
            break
        for tree, level, _ in live:
            tree.levels.append(level)
        nodes = [node for _, level, _ in live for node in level]
        # One generate call per agent for the whole level of every tree (agents of a shared base together).
        requests = [
            GenerationRequest(
                [node.prompts[i] for node in nodes],
                num_generations,
                config,
                [
                    derive_seed(tree_seed, turn, i, k)
                    for _, level, tree_seed in live
                    for k in range(len(level) * num_generations)
                ],
            )
            for i in range(n)
        ]
        for policy, outs in zip(policies, generate_together(policies, requests), strict=True):
            for tree, _, _ in live:
                tree.generate_calls += 1
            if len(outs) != len(nodes) or any(len(o) != num_generations for o in outs):
                raise RuntimeError(
                    f"{type(policy).__name__}.generate returned a wrong shape: expected "
                    f"{len(nodes)} prompts x {num_generations} samples"
                )
            for node, node_outs in zip(nodes, outs, strict=True):
                node.completions.append(list(node_outs))
        # Every joint action of the level steps its own clone, all trees in one batch.
        clones, actions, owners = [], [], []
        for tree, level, _ in live:
            for node in level:
                for idx in combos:
                    node.joints.append(JointAction(indices=idx))
                    clones.append(node.env.clone())
                    actions.append({agent_names[a]: node.completions[a][g].text for a, g in enumerate(idx)})
                    owners.append((tree, node.joints[-1]))
                if not keep_envs:
                    node.env = None
        results = step_many(clones, actions)
        next_levels: dict[int, list[TreeNode]] = {id(tree): [] for tree in trees}
        for (tree, joint), clone, (obs, rewards, terms, truncs, infos) in zip(owners, clones, results, strict=True):
            tree.env_steps += 1
            tree.reward_hacks += any(isinstance(i, dict) and i.get("reward_hack") for i in (infos or {}).values())
            joint.reward = team_reward(clone, rewards)
            joint.levels = _info_levels(infos)
            joint.done = episode_over(clone, terms, truncs)
            if joint.done or turn == num_turns:
                continue
            child = TreeNode(turn=turn + 1, prompts=[obs[a] for a in agent_names], env=clone)
            joint.child = child
            next_levels[id(tree)].append(child)
        levels = [next_levels[id(tree)] for tree in trees]
    return trees

"""Node groups (the unit MAGRPO learns from) and per-turn tree statistics.

A node group is one agent's G responses at one tree node with the credit of each
(see :func:`learners.magrpo.advantages.agent_credits`). Groups hold plain lists only,
so rollout buffers can be checkpointed and restored exactly.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Sequence

from comlrl_core.policy import Policy
from learners.magrpo.advantages import agent_credits, node_mean
from learners.magrpo.tree import RolloutTree


@dataclass
class NodeGroup:
    agent: int
    turn: int
    prompt_ids: list[list[int]]  # one per response (the same prompt for a whole group)
    completion_ids: list[list[int]]
    returns: list[float]
    mean_reward: float
    mean_return: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "NodeGroup":
        return cls(**data)


def groups_from_tree(tree: RolloutTree, policies: Sequence[Policy]) -> list[list[NodeGroup]]:
    """Per agent, the node groups of the tree, level by level (returns must be computed)."""
    out: list[list[NodeGroup]] = [[] for _ in policies]
    for level in tree.levels:
        for node in level:
            rewards = [j.reward for j in node.joints]
            rets = [j.ret for j in node.joints]
            for agent, policy in enumerate(policies):
                comps = node.completions[agent]
                prompt_ids = [list(c.prompt_token_ids) for c in comps]
                if any(not p for p in prompt_ids):  # policy did not record them: encode once
                    encoded = list(policy.encode_prompt(node.prompts[agent]))
                    prompt_ids = [p or encoded for p in prompt_ids]
                out[agent].append(
                    NodeGroup(
                        agent=agent,
                        turn=node.turn,
                        prompt_ids=prompt_ids,
                        completion_ids=[list(c.token_ids) for c in comps],
                        returns=agent_credits(node, agent),
                        mean_reward=node_mean(rewards),
                        mean_return=node_mean(rets),
                    )
                )
    return out


def forest_metrics(trees: Sequence[RolloutTree]) -> dict[str, float]:
    """``turn_{t}/reward_mean`` and ``turn_{t}/expected_return`` (node means, averaged
    over every tree's nodes of turn t), ``level/{name}`` (the env's reward levels, mean over
    every joint step, when its infos report ``levels``), and the size figures summed over
    the trees of the step (``rollout/trees``: how many)."""
    metrics: dict[str, float] = {}
    turns = sorted({level[0].turn for tree in trees for level in tree.levels if level})
    for t in turns:
        nodes = [n for tree in trees for level in tree.levels for n in level if n.turn == t]
        metrics[f"turn_{t}/reward_mean"] = node_mean([node_mean([j.reward for j in n.joints]) for n in nodes])
        metrics[f"turn_{t}/expected_return"] = node_mean([node_mean([j.ret for j in n.joints]) for n in nodes])
        metrics[f"turn_{t}/num_nodes"] = float(len(nodes))
    # reward levels (infos["levels"], e.g. CoopCode's tests / cooperation), mean over every joint step
    joints = [j for tree in trees for level in tree.levels for n in level for j in n.joints]
    for name in sorted({key for j in joints for key in j.levels}):
        values = [j.levels[name] for j in joints if name in j.levels]
        metrics[f"level/{name}"] = node_mean(values)
    if not trees:
        return metrics
    metrics["rollout/env_steps"] = float(sum(tree.env_steps for tree in trees))
    metrics["rollout/reward_hacks"] = float(sum(tree.reward_hacks for tree in trees))  # flagged steps
    metrics["rollout/generate_calls"] = float(max(tree.generate_calls for tree in trees))  # shared by the trees
    metrics["rollout/leaves"] = float(sum(len(tree.leaves()) for tree in trees))
    metrics["rollout/trees"] = float(len(trees))
    return metrics

"""The packing block's walk of a model (comlrl_core/models/cpu/model_walk.py) lists what
nn.Module's own walks list, in their order, shared modules and tied weights included."""

from __future__ import annotations

import collections

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from comlrl_core.models.cpu.model_walk import ModelWalk, module_tree


def _named_uses(model: nn.Module) -> collections.Counter[int]:
    return collections.Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))


@st.composite
def module_dags(draw):
    """A root over up to 12 modules, each holding later ones as children (a module may sit
    under several parents, and a parent may leave a slot empty), some with a linear
    weight of their own, some weights tied to another module's."""
    count = draw(st.integers(1, 12))
    modules = [nn.Module() for _ in range(count)]
    for module in modules:
        if draw(st.booleans()):
            module.weight = nn.Parameter(torch.zeros(2, 2))
    for index, module in enumerate(modules):
        later = list(range(index + 1, count))
        for slot, child in enumerate(draw(st.lists(st.sampled_from(later), max_size=3)) if later else []):
            module.add_module(f"child{slot}", modules[child])
        if draw(st.booleans()):
            module.register_module("empty", None)
    holders = [m for m in modules if "weight" in m._parameters]
    if len(holders) > 1 and draw(st.booleans()):  # tie the last holder's weight to the first's
        holders[-1].weight = holders[0].weight
    root = nn.Module()
    for slot, index in enumerate(draw(st.lists(st.integers(0, count - 1), min_size=1, max_size=4))):
        root.add_module(f"top{slot}", modules[index])
    return root


@settings(max_examples=200, deadline=None)
@given(module_dags())
def test_the_walk_lists_what_nn_modules_own_walks_list_in_their_order(model):
    assert [id(m) for m in module_tree(model)] == [id(m) for _, m in model.named_modules(remove_duplicate=False)]
    walk = ModelWalk(model)
    assert [id(m) for m in walk.modules] == [id(m) for m in model.modules()]
    assert walk.uses == _named_uses(model)


def test_a_lora_teams_walk_matches_and_each_decision_is_taken_once(lora_team):
    model = lora_team[0].model
    walk = ModelWalk(model)
    assert [id(m) for m in walk.modules] == [id(m) for m in model.modules()]
    assert walk.uses == _named_uses(model)
    # the base's embeddings and output layer share one weight: counted twice
    embeddings = model.get_base_model().get_input_embeddings()
    assert walk.uses[id(embeddings.weight)] == 2
    # the plain linear layers (the base's and the adapters' factors), not peft's LoRA wrappers
    assert [id(m) for m in walk.linears] == [id(m) for m in model.modules() if type(m) is nn.Linear]
    assert len(walk.linears) > 4 * len(model.get_base_model().model.layers)
    asked: list[nn.Module] = []

    def is_wide(module: nn.Linear) -> bool:
        asked.append(module)
        return module.in_features > 8  # not the adapters' B factors (rank 8)

    wide = walk.select("wide", is_wide)
    assert walk.select("wide", is_wide) is wide and len(asked) == len(walk.linears)  # decided once
    assert wide == {id(m) for m in walk.linears if m.in_features > 8} and 0 < len(wide) < len(walk.linears)

"""Log-probs of G completions of one prompt with the prompt encoded once (exact gradients).

MAGRPO scores groups: G completions of the same prompt, and prompts are usually much
longer than completions. Encoding each prompt once, then expanding its key/value cache
to the G rows, cuts the forward and backward work on prompts by a factor G. Gradients
stay exact: they flow from every completion row back through the shared cache into the
single prompt pass (autograd sums the G branches).

Prompts of different groups often share a beginning too (the task text, before each
node's own history and feedback). When they do, that common prefix is encoded once for
all groups of the batch (three passes: common prefix -> each group's rest -> the
completions), with the same exactness argument.

This works for policies that expose a transformers causal LM as ``policy.model`` (with
``pad_token_id``; LoRA agents activate their adapter through ``policy.activate()``) and do
not use gradient checkpointing (which disables the cache). Other policies use their own
``token_logprobs``. It belongs in ``TransformersPolicy`` eventually; it lives here until
the policy contract grows a grouped scoring call.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from comlrl_core.models.sampling import cache_kwarg_name, padded_position_ids, supports_logits_to_keep
from comlrl_core.policy import Policy


def supports_shared_prefix(policy: Any) -> bool:
    if not isinstance(policy, Policy):  # the adapter switch and compute context are the contract's
        return False
    model = getattr(policy, "model", None)
    if model is None or not isinstance(getattr(policy, "pad_token_id", None), int):
        return False
    checkpointing = getattr(model, "is_activation_checkpointing", None)
    if checkpointing is None:
        checkpointing = getattr(model, "is_gradient_checkpointing", False)
    return not (model.training and checkpointing)


def _returned_cache(outputs: Any) -> Any:
    cache = getattr(outputs, "cache", None)
    return cache if cache is not None else getattr(outputs, "past_key_values", None)


def _common_prefix_length(rows: Sequence[Sequence[int]]) -> int:
    first = rows[0]
    n = min(len(r) for r in rows)
    for i in range(n):
        token = first[i]
        if any(r[i] != token for r in rows[1:]):
            return i
    return n


def _left_padded(rows: Sequence[Sequence[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for k, row in enumerate(rows):
        if len(row):
            ids[k, width - len(row) :] = torch.as_tensor(list(row), dtype=torch.long)
            mask[k, width - len(row) :] = 1
    return ids, mask


# Below this many common tokens a separate pass costs more than it saves.
MIN_COMMON_PREFIX = 16


def shared_prefix_token_logprobs(
    policy: Any, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[Sequence[int]]]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs ``[sum G_k, C]`` and mask for ``completion_ids[k]`` (G of them,
    the same G for every k) given ``prompt_ids[k]``; rows in group order.

    Two details keep the dense per-vocabulary work to one copy of each: the token
    embeddings of all passes are looked up in one call (one embedding gradient instead of
    one per pass), and the last prompt token is fed as the first input of every
    completion row (so the output head runs once, on the completion rows only, instead of
    a second time on the prompts' last positions).
    """
    groups = len(prompt_ids)
    sizes = {len(c) for c in completion_ids}
    if len(completion_ids) != groups or len(sizes) != 1:
        raise ValueError("shared_prefix_token_logprobs needs one prompt per group and equal group sizes")
    if any(len(p) == 0 for p in prompt_ids):
        raise ValueError("every prompt needs at least one token (use encode_prompt)")
    g = sizes.pop()
    flat = [c for group in completion_ids for c in group]
    rows, width_c = len(flat), max((len(c) for c in flat), default=0)
    device, pad = policy.device, policy.pad_token_id
    if rows == 0 or width_c == 0:
        return torch.zeros(rows, width_c, device=device), torch.zeros(rows, width_c, device=device)
    # shift: the last prompt token opens each completion row (needs prompts of >= 2 tokens,
    # so that every group keeps a token of its own for the prompt pass)
    shortest = min(len(p) for p in prompt_ids)
    shift = shortest >= 2
    own = 2 if shift else 1
    common = _common_prefix_length(prompt_ids) if groups > 1 else 0
    common = min(common, shortest - own)
    if common < MIN_COMMON_PREFIX:
        common = 0
    ids_p, mask_p = _left_padded([p[common : len(p) - 1 if shift else len(p)] for p in prompt_ids], pad)
    targets = torch.full((rows, width_c), pad, dtype=torch.long)
    # unshifted, the completion rows are fed their own tokens
    inputs_c = torch.full((rows, width_c), pad, dtype=torch.long) if shift else targets
    mask_c = torch.zeros((rows, width_c), dtype=torch.long)
    for r, c in enumerate(flat):
        if c:
            targets[r, : len(c)] = torch.as_tensor(list(c), dtype=torch.long)
            mask_c[r, : len(c)] = 1
            if shift:
                inputs_c[r, 0] = prompt_ids[r // g][-1]
                inputs_c[r, 1 : len(c)] = targets[r, : len(c) - 1]
    shared_ids = torch.as_tensor(list(prompt_ids[0][:common]), dtype=torch.long)
    ids_p, mask_p, inputs_c, targets, mask_c = (t.to(device) for t in (ids_p, mask_p, inputs_c, targets, mask_c))

    policy.activate()
    model = policy.model
    cache_kw = cache_kwarg_name(model)
    keep = {"logits_to_keep": 1} if supports_logits_to_keep(model) else {}
    with policy.compute_context():  # mixed precision
        # one embedding lookup for the three passes
        all_ids = torch.cat([shared_ids.to(device), ids_p.reshape(-1), inputs_c.reshape(-1)])
        embeds = model.get_input_embeddings()(all_ids)
        emb_shared, emb_p, emb_c = torch.split(embeds, [common, ids_p.numel(), inputs_c.numel()])
        cache = None
        if common:  # the groups' common beginning, once for all of them
            out_0 = model(
                inputs_embeds=emb_shared[None],
                attention_mask=torch.ones(1, common, dtype=torch.long, device=device),
                position_ids=torch.arange(common, device=device)[None],
                use_cache=True,
                **keep,
            )
            cache = _returned_cache(out_0)
            cache.batch_repeat_interleave(groups)
            mask_p = torch.cat([torch.ones(groups, common, dtype=mask_p.dtype, device=device), mask_p], dim=1)
        width_rest = ids_p.shape[1]
        out_p = model(
            inputs_embeds=emb_p.reshape(groups, width_rest, -1),
            attention_mask=mask_p,
            position_ids=padded_position_ids(mask_p)[:, mask_p.shape[1] - width_rest :],
            use_cache=True,
            **keep,
            **({cache_kw: cache} if cache is not None else {}),
        )
        cache = _returned_cache(out_p)
        cache.batch_repeat_interleave(g)
        full_mask = torch.cat([mask_p.repeat_interleave(g, dim=0), mask_c], dim=1)
        positions = padded_position_ids(full_mask)[:, mask_p.shape[1] :]
        out_c = model(
            inputs_embeds=emb_c.reshape(rows, width_c, -1),
            attention_mask=full_mask,
            position_ids=positions,
            use_cache=True,
            **{cache_kw: cache},
        )
    if shift:
        logits = out_c.logits.float()
    else:  # the prompt pass's last position predicts completion token 0
        first_logits = out_p.logits[:, -1, :].repeat_interleave(g, dim=0)
        logits = torch.cat([first_logits.unsqueeze(1), out_c.logits[:, :-1, :]], dim=1).float()
    chosen = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    logprobs = chosen - torch.logsumexp(logits, dim=-1)
    mask = mask_c.to(logprobs.dtype)
    return logprobs * mask, mask

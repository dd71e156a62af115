"""TransformersPolicy: a transformers causal LM as a trainable :class:`Policy`.

Public API::

    TransformersPolicy.from_source(source: str, **AgentSpec fields) -> TransformersPolicy
        e.g. from_source(tiny_model_path(), lora=True, lora_r=4, device="cpu")
    TransformersPolicy.from_spec(spec: AgentSpec, adapter_name="agent_0") -> TransformersPolicy
    policy.generate(prompts, num_samples=1, generation_config=None, seed=None)
        -> list[list[Completion]]          prompts x samples in one batched decode
                                           (each prompt prefilled once, KV cache shared)
    policy.encode_prompt(prompt) -> list[int]   (chat template + system prompt applied)
    policy.token_logprobs(prompt_ids, completion_ids) -> (logprobs [B, C], mask [B, C])
    policy.sequence_logprobs(prompt_ids, completion_ids, per_token=False) -> Tensor [B]
    policy.parameters() / policy.named_parameters()   this agent's trainable params only
    policy.train(mode=True) / policy.eval()
    policy.save(directory) / policy.load(directory)   LoRA: adapter only; else full weights
    policy.model, policy.tokenizer, policy.device, policy.name, policy.is_lora,
    policy.adapter_name, policy.shared_base, policy.spec, policy.source

    policy.completion_stats                     CompletionStats of the completions generated so far

Conventions: prompts are left-padded; a completion's ``token_ids`` end with EOS when
generation stopped on it (finish_reason "eos"); with ``GenerationConfig.stop`` strings a
completion that holds one is cut (finish_reason "stop": text before the stop string,
token ids up to the token that completed it); else finish_reason is "length"; pads
never appear. ``token_logprobs`` counts every real completion token, EOS included.
Several policies may share one base model (``comlrl_core.models.team``); each activates its
own adapter before each forward pass.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Sequence, cast

import torch
from torch import nn

from comlrl_core.models.agent_spec import AgentSpec
from comlrl_core.models.completion_post import CompletionStats, cut_at_stop
from comlrl_core.models.cpu import row_products
from comlrl_core.models.cpu.gqa_attention import use_cpu_gqa_attention
from comlrl_core.models.cpu.memory_stats import end_of_phase
from comlrl_core.models.cpu.model_walk import ModelWalk
from comlrl_core.models.cpu.packed_linear import prepacked_linears
from comlrl_core.models.eval_mode import sampling_eval_mode, without_idle_hub_kernels
from comlrl_core.models.lean_decode import lean_decoder
from comlrl_core.models.lean_lora import lean_lora_forwards
from comlrl_core.models.lora import (
    SharedLoraBase,
    adapter_lora_settings,
    enable_gradient_checkpointing,
    merge_lora_adapter,
)
from comlrl_core.models.mixed_adapters import sliced_adapter_batches
from comlrl_core.models.model_source import (
    ModelSource,
    load_causal_lm,
    load_tokenizer,
    resolve_model_source,
)
from comlrl_core.models.policy_files import load_policy, save_policy
from comlrl_core.models.sampling import (
    padded_position_ids,
    prompt_groups_within_budget,
    sample_tokens,
    supports_logits_to_keep,
)
from comlrl_core.models.stop_watch import StopWatch
from comlrl_core.models.swiglu import use_lean_swiglu
from comlrl_core.policy import Completion, FinishReason, GenerationConfig, Policy, completion_seeds


def load_base_model(source: ModelSource, spec: AgentSpec) -> nn.Module:
    """Load ``source`` in the spec's dtype onto its device, ready for LoRA or full training."""
    model = load_causal_lm(source, spec.base_torch_dtype)
    model.to(spec.resolved_device())
    without_idle_hub_kernels(model)  # on the CPU they select no kernel and slow every mode switch
    use_cpu_gqa_attention(model)  # no key/value head copies in masked CPU passes
    use_lean_swiglu(model)  # training forwards keep gate and up, not silu(gate) too
    if spec.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    return model


def _eos_ids(tokenizer, model: nn.Module) -> list[int]:
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(gen_eos, int):
        ids.add(gen_eos)
    elif gen_eos:
        ids.update(int(i) for i in gen_eos)
    if not ids:
        raise ValueError("the tokenizer and generation config define no EOS token")
    return sorted(ids)


class TransformersPolicy(Policy):
    """One agent backed by a transformers causal LM (optionally a LoRA adapter)."""

    trainable = True
    # False: repeat each prompt num_samples times and prefill them all (the slower reference
    # path, kept for equivalence tests and benchmarks); not part of the public API
    _share_prompt_prefill: bool = True

    def __init__(
        self,
        model: nn.Module,
        tokenizer,
        *,
        name: str = "policy",
        use_chat_template: bool = True,
        system_prompt: str | None = None,
        shared_base: SharedLoraBase | None = None,
        adapter_name: str | None = None,
        spec: AgentSpec | None = None,
        source: ModelSource | None = None,
    ) -> None:
        if (shared_base is None) != (adapter_name is None):
            raise ValueError("shared_base and adapter_name go together (LoRA) or not at all")
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.use_chat_template = use_chat_template
        self.system_prompt = system_prompt
        self.shared_base = shared_base
        self.adapter_name = adapter_name
        self.spec = spec
        self.source = source
        self.eos_token_ids = _eos_ids(tokenizer, model)
        pad = tokenizer.pad_token_id
        self.pad_token_id = int(pad) if pad is not None else self.eos_token_ids[0]
        self._keep_logits = supports_logits_to_keep(model)
        self.completion_stats = CompletionStats()
        mixed = spec.mixed_precision if spec is not None else "no"
        self.autocast_dtype: torch.dtype | None = torch.bfloat16 if mixed == "bf16" else None

    # -- construction ------------------------------------------------------------------
    @classmethod
    def from_source(cls, source: str, **spec_fields) -> "TransformersPolicy":
        """Build one agent from a model source; keyword arguments are AgentSpec fields."""
        return cls.from_spec(AgentSpec(model=source, **spec_fields))

    @classmethod
    def from_spec(cls, spec: AgentSpec, adapter_name: str = "agent_0") -> "TransformersPolicy":
        source = resolve_model_source(spec.model)
        tokenizer = load_tokenizer(source)
        model = load_base_model(source, spec)
        if spec.lora:
            return cls.with_new_adapter(SharedLoraBase(model), tokenizer, spec, adapter_name, source)
        if source.adapter is not None:  # full training from a LoRA warm start: merge it in
            model = merge_lora_adapter(model, source.adapter)
        model.requires_grad_(True)
        return cls(
            model,
            tokenizer,
            name=spec.name or source.name,
            use_chat_template=spec.use_chat_template,
            system_prompt=spec.system_prompt,
            spec=spec,
            source=source,
        )

    @classmethod
    def with_new_adapter(
        cls,
        shared: SharedLoraBase,
        tokenizer,
        spec: AgentSpec,
        adapter_name: str,
        source: ModelSource | None = None,
    ) -> "TransformersPolicy":
        """Add a LoRA adapter to ``shared`` and return the policy that owns it: a fresh one,
        or, when ``source`` is an adapter folder (a warm start), one of the saved adapter's
        shape (rank, alpha, targets: they must fit its weights) holding its weights."""
        if source is not None and source.adapter is not None:
            saved = adapter_lora_settings(source.adapter)
            shared.add_adapter(adapter_name, saved["r"], saved["alpha"], spec.lora_dropout, saved["target_modules"])
            shared.load_adapter(adapter_name, source.adapter)
        else:
            shared.add_adapter(adapter_name, spec.lora_r, spec.lora_alpha, spec.lora_dropout, spec.lora_target_modules)
        return cls(
            shared.peft_model(),
            tokenizer,
            name=spec.name or (source.name if source else adapter_name),
            use_chat_template=spec.use_chat_template,
            system_prompt=spec.system_prompt,
            shared_base=shared,
            adapter_name=adapter_name,
            spec=spec,
            source=source,
        )

    # -- basics ------------------------------------------------------------------------
    @property
    def is_lora(self) -> bool:
        return self.shared_base is not None

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def compute_context(self) -> contextlib.AbstractContextManager:
        """bf16 autocast under ``mixed_precision="bf16"`` (fp32 weights stay), else nothing."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    def _lora(self) -> tuple[SharedLoraBase, str] | None:
        """(shared base, adapter name) of a LoRA policy (set together, see ``__init__``); None if full."""
        if self.shared_base is None or self.adapter_name is None:
            return None
        return self.shared_base, self.adapter_name

    def activate(self) -> None:
        """LoRA: make this agent's adapter the active one of the shared base."""
        lora = self._lora()
        if lora is not None:
            shared, adapter = lora
            shared.activate(adapter)

    def parameters(self) -> Iterator[nn.Parameter]:
        """This agent's trainable parameters: its adapter (LoRA) or all weights."""
        lora = self._lora()
        if lora is not None:
            shared, adapter = lora
            return iter(shared.adapter_parameters(adapter))
        return (p for p in self.model.parameters() if p.requires_grad)

    def named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        mine = {id(p) for p in self.parameters()}
        return ((n, p) for n, p in self.model.named_parameters() if id(p) in mine)

    def train(self, mode: bool = True) -> "TransformersPolicy":
        """Dropout (and gradient checkpointing) on. Shared bases switch for all their agents."""
        self.model.train(mode)
        return self

    def eval(self) -> "TransformersPolicy":
        return self.train(False)

    def __repr__(self) -> str:
        kind = f"lora:{self.adapter_name}" if self.is_lora else "full"
        return f"TransformersPolicy(name={self.name!r}, {kind}, device={self.device})"

    # -- tokenisation ------------------------------------------------------------------
    def encode_prompt(self, prompt: str) -> list[int]:
        if not isinstance(prompt, str):
            raise TypeError(f"a prompt must be a str, got {type(prompt).__name__}")
        if self.use_chat_template and getattr(self.tokenizer, "chat_template", None):
            messages = []
            if self.system_prompt is not None:
                messages.append({"role": "system", "content": self.system_prompt})
            messages.append({"role": "user", "content": prompt})
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            # the template already holds any BOS / special tokens it wants
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        else:
            text = prompt if self.system_prompt is None else f"{self.system_prompt}\n\n{prompt}"
            ids = self.tokenizer(text, add_special_tokens=True)["input_ids"]
        if not ids:  # an empty raw prompt: condition on BOS (or EOS) so there is a context
            start = self.tokenizer.bos_token_id
            ids = [int(start if start is not None else self.eos_token_ids[0])]
        return list(ids)

    def _left_pad(self, rows: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for b, row in enumerate(rows):
            if row:
                ids[b, width - len(row) :] = torch.as_tensor(list(row), dtype=torch.long)
                mask[b, width - len(row) :] = 1
        return ids.to(self.device), mask.to(self.device)

    # -- generation --------------------------------------------------------------------
    def generate(
        self,
        prompts: Sequence[str],
        num_samples: int = 1,
        generation_config: GenerationConfig | None = None,
        seed: int | Sequence[int] | None = None,
    ) -> list[list[Completion]]:
        if isinstance(prompts, str):
            raise TypeError("generate takes a list of prompts; wrap a single prompt as [prompt]")
        if not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"num_samples must be an int >= 1, got {num_samples!r}")
        cfg = generation_config or GenerationConfig()
        if not prompts:
            return []
        encoded = [self.encode_prompt(p) for p in prompts]
        generator = self._generators(seed, len(prompts), num_samples)
        tokens, lengths, on_eos = self.sample_encoded(encoded, num_samples, cfg, generator)
        return self.completions_from_rows(encoded, num_samples, cfg, tokens, lengths, on_eos)

    def completions_from_rows(
        self,
        encoded: Sequence[Sequence[int]],
        num_samples: int,
        cfg: GenerationConfig,
        tokens: Sequence[list[int]],
        lengths: Sequence[int],
        on_eos: Sequence[bool],
    ) -> list[list[Completion]]:
        """Completions (text, ids, finish reason) from the rows of :meth:`sample_encoded`."""
        results: list[list[Completion]] = []
        for p, prompt_ids in enumerate(encoded):
            group = []
            for s in range(num_samples):
                b = p * num_samples + s
                ids = tokens[b][: lengths[b]]
                body = ids[:-1] if on_eos[b] else ids
                cut = cut_at_stop(self.tokenizer, body, cfg.stop) if cfg.stop else None
                if cut is not None:  # sampling ran on; what follows the stop string is dropped
                    text, ids = cut
                    reason: FinishReason = "stop"
                else:
                    text = self.tokenizer.decode(body, skip_special_tokens=True)
                    reason = "eos" if on_eos[b] else "length"
                completion = Completion(
                    text=text, token_ids=ids, finish_reason=reason, prompt_token_ids=list(prompt_ids)
                )
                self.completion_stats.record(completion)
                group.append(completion)
            results.append(group)
        return results

    def _generators(
        self, seed: int | Sequence[int] | None, num_prompts: int, num_samples: int
    ) -> torch.Generator | list[torch.Generator]:
        """One CPU generator per completion (rows independent of the batch) when ``seed``
        gives per-completion seeds, else one generator for the whole call."""
        row_seeds = completion_seeds(seed, num_prompts, num_samples)
        if row_seeds is not None:
            return [torch.Generator().manual_seed(s) for s in row_seeds]
        if seed is None:  # still reproducible under torch.manual_seed
            seed = int(torch.randint(0, 2**62, (1,)).item())
        generator = torch.Generator(device=self.device)
        generator.manual_seed(int(cast(int, seed)))  # no per-row seeds: seed is one integer
        return generator

    def sample_encoded(
        self,
        encoded: Sequence[Sequence[int]],
        num_samples: int,
        cfg: GenerationConfig,
        generator: torch.Generator | Sequence[torch.Generator],
        row_adapters: Sequence[str] | None = None,
    ) -> tuple[list[list[int]], list[int], list[bool]]:
        """Sample ``num_samples`` completions of every encoded prompt; per output row
        (prompt-major): the generated ids, how many are real, and whether EOS ended it.

        Rows are sampled in as few calls as ``cfg.max_batch_tokens`` allows, each call's
        prompts prefilled in chunks of ``cfg.prefill_token_budget`` tokens. With one
        generator per row, prompts are grouped by length first (less padding; each row's
        tokens are its own generator's whatever the grouping); with one generator for the
        call, calls follow the prompt order. ``row_adapters`` (one adapter name per prompt)
        samples the adapters of a shared LoRA base together (see :func:`sample_tokens`).
        """
        per_row = not isinstance(generator, torch.Generator)
        fan_out = num_samples if self._share_prompt_prefill else 1
        calls = prompt_groups_within_budget(
            [len(ids) for ids in encoded], num_samples, cfg.max_new_tokens, cfg.max_batch_tokens, per_row
        )
        rows_out: list[tuple[list[int], int, bool]] = [([], 0, False)] * (len(encoded) * num_samples)
        if row_adapters is None:
            self.activate()
        widest_call = max(len(call) for call in calls) * num_samples
        # rows stop at a stop string while sampling; the text is still cut afterwards
        stop_watch = StopWatch(self.tokenizer, cfg.stop) if cfg.stop else None
        # one autocast region for the whole decode: trainable fp32 weights are cast to
        # bf16 once (autocast's cast cache), not once per token; on CPU the linear
        # weights are packed once for the GEMM library, not once per token
        # one walk of the modules for the mode check, the packing and the LoRA layers' overrides
        walk = ModelWalk(self.model)
        mixed = (
            sliced_adapter_batches(self.model, walk.modules) if row_adapters is not None else contextlib.nullcontext()
        )
        # a few-row call's lean decoding step reads the plain weights through the few-row
        # kernel (cpu/row_products.py): nothing to pack for it
        few_row_kernel = widest_call <= row_products.MAX_ROWS and lean_decoder(self.model) is not None
        packed = prepacked_linears(self.model, widest_call, cfg.max_new_tokens, walk, few_row_kernel)
        # LoRA layers add their update in place (no-grad passes)
        lean_lora = lean_lora_forwards(self.model, walk.modules) if self.is_lora else contextlib.nullcontext()
        # no dropout while sampling; the model's mode switched only where a flag changes
        with sampling_eval_mode(self.model, walk), self.compute_context(), packed, mixed, lean_lora:
            for call in calls:
                if row_adapters is not None:  # each adapter's rows contiguous: they run on row slices
                    call = sorted(call, key=lambda p: row_adapters[p])
                if self._share_prompt_prefill:  # prefill each prompt once; rows fan out prompt-major
                    input_ids, mask = self._left_pad([encoded[p] for p in call])
                    adapters = [row_adapters[p] for p in call] if row_adapters is not None else None
                else:  # reference path (tests, benchmarks): every prompt repeated before prefill
                    input_ids, mask = self._left_pad([encoded[p] for p in call for _ in range(num_samples)])
                    adapters = [row_adapters[p] for p in call for _ in range(num_samples)] if row_adapters else None
                rows = [p * num_samples + s for p in call for s in range(num_samples)]
                out = sample_tokens(
                    self.model,
                    input_ids,
                    mask,
                    max_new_tokens=cfg.max_new_tokens,
                    temperature=cfg.temperature,
                    top_p=cfg.top_p,
                    top_k=cfg.top_k,
                    eos_token_ids=self.eos_token_ids,
                    pad_token_id=self.pad_token_id,
                    generator=[cast(Sequence[torch.Generator], generator)[r] for r in rows] if per_row else generator,
                    num_samples=fan_out,
                    row_adapters=adapters,
                    prefill_token_budget=cfg.prefill_token_budget,
                    stop_watch=stop_watch,
                )
                found = zip(out.tokens.tolist(), out.lengths.tolist(), out.stopped_on_eos.tolist(), strict=True)
                for r, (ids, length, eos) in zip(rows, found, strict=True):
                    rows_out[r] = (ids, length, eos)
                del out, found
                end_of_phase()  # the call's KV cache is freed: inside training, what the allocator kept goes back
        return [r[0] for r in rows_out], [r[1] for r in rows_out], [r[2] for r in rows_out]

    # -- scoring -----------------------------------------------------------------------
    def token_logprobs(
        self, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token log-probs ``[B, C]`` (float32, differentiable) and the 0/1 mask.

        Layout: prompts left-padded to a common width P, completions right-padded to C,
        so every row's completion sits in columns P..P+C-1 and its predicting logits in
        P-1..P+C-2; position ids skip the padding, so padding changes nothing.
        """
        if len(prompt_ids) != len(completion_ids):
            raise ValueError(f"got {len(prompt_ids)} prompts but {len(completion_ids)} completions")
        batch = len(prompt_ids)
        if batch == 0:
            return torch.zeros(0, 0, device=self.device), torch.zeros(0, 0, device=self.device)
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("every prompt needs at least one token (use encode_prompt)")
        width_p = max(len(p) for p in prompt_ids)
        width_c = max(len(c) for c in completion_ids)
        if width_c == 0:
            return torch.zeros(batch, 0, device=self.device), torch.zeros(batch, 0, device=self.device)

        ids = torch.full((batch, width_p + width_c), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for b, (p, c) in enumerate(zip(prompt_ids, completion_ids, strict=True)):
            ids[b, width_p - len(p) : width_p] = torch.as_tensor(list(p), dtype=torch.long)
            mask[b, width_p - len(p) : width_p] = 1
            if len(c):
                ids[b, width_p : width_p + len(c)] = torch.as_tensor(list(c), dtype=torch.long)
                mask[b, width_p : width_p + len(c)] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)

        self.activate()
        extra = {"logits_to_keep": width_c + 1} if self._keep_logits else {}
        with self.compute_context():
            outputs = self.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=padded_position_ids(mask),
                use_cache=False,
                **extra,
            )
        logits = outputs.logits
        # keep only the logits that predict completion tokens
        logits = logits[:, -(width_c + 1) : -1, :] if extra else logits[:, width_p - 1 : -1, :]
        logits = logits.float()
        targets = ids[:, width_p:]
        # gather - logsumexp: avoids materialising a second [B, C, V] log_softmax tensor
        chosen = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        logprobs = chosen - torch.logsumexp(logits, dim=-1)
        comp_mask = mask[:, width_p:].to(logprobs.dtype)
        return logprobs * comp_mask, comp_mask

    # -- persistence (comlrl_core.models.policy_files) ----------------------------------
    def save(self, directory: str) -> None:
        """LoRA: adapter only (peft layout, safetensors). Full: ``save_pretrained`` folder."""
        save_policy(self, directory)

    def load(self, directory: str) -> None:
        """Load weights saved by :meth:`save` into this policy, in place."""
        load_policy(self, directory)

"""Contract-following fakes for the MAGRPO tests: policies and a counting ParallelEnv."""

from __future__ import annotations

import copy
import os
from typing import Callable, Sequence

import torch

from comlrl_core.policy import Completion, GenerationConfig, Policy, completion_seeds

EOS = 0


def _text(tokens: Sequence[int]) -> str:
    return "".join(chr(ord("a") + t - 1) for t in tokens if t != EOS)


class BigramPolicy(Policy):
    """A trainable bigram model over a tiny vocabulary (token 0 = EOS, others = letters)."""

    trainable = True

    def __init__(self, vocab: int = 6, init_seed: int = 0, name: str = "bigram") -> None:
        gen = torch.Generator().manual_seed(init_seed)
        self.logits = torch.nn.Parameter(0.1 * torch.randn(vocab, vocab, generator=gen))
        self.vocab = vocab
        self.name = name
        self.generate_calls: list[tuple[int, int]] = []  # (num prompts, num_samples)
        self.logprob_calls: list[int] = []  # batch sizes

    def encode_prompt(self, prompt: str) -> list[int]:
        return [1 + (ord(c) % (self.vocab - 1)) for c in prompt[-4:]] or [1]

    def generate(self, prompts, num_samples=1, generation_config=None, seed=None):
        cfg = generation_config or GenerationConfig(max_new_tokens=4)
        self.generate_calls.append((len(prompts), num_samples))
        row_seeds = completion_seeds(seed, len(prompts), num_samples)
        gen = torch.Generator().manual_seed(0 if seed is None or row_seeds else seed)
        out = []
        for p, prompt in enumerate(prompts):
            p_ids = self.encode_prompt(prompt)
            samples = []
            for s in range(num_samples):
                if row_seeds:  # per-completion seeds: each completion draws from its own stream
                    gen = torch.Generator().manual_seed(row_seeds[p * num_samples + s])
                prev, toks, reason = p_ids[-1], [], "length"
                for _ in range(cfg.max_new_tokens):
                    probs = torch.softmax(self.logits.detach()[prev] / max(cfg.temperature, 1e-3), -1)
                    tok = int(torch.multinomial(probs, 1, generator=gen))
                    toks.append(tok)
                    prev = tok
                    if tok == EOS:
                        reason = "eos"
                        break
                samples.append(Completion(_text(toks), toks, reason, p_ids))
            out.append(samples)
        return out

    def token_logprobs(self, prompt_ids, completion_ids):
        self.logprob_calls.append(len(prompt_ids))
        width = max((len(c) for c in completion_ids), default=0)
        logp = torch.zeros(len(prompt_ids), width)
        mask = torch.zeros(len(prompt_ids), width, dtype=torch.long)
        rows = []
        for p, c in zip(prompt_ids, completion_ids, strict=True):
            if not c:
                rows.append(torch.zeros(width))
                continue
            prev = torch.tensor([p[-1]] + list(c[:-1]))
            lp = torch.log_softmax(self.logits[prev], -1)[torch.arange(len(c)), torch.tensor(c)]
            rows.append(torch.cat([lp, torch.zeros(width - len(c))]))
        for i, c in enumerate(completion_ids):
            mask[i, : len(c)] = 1
        logp = torch.stack(rows) if rows else logp
        return logp, mask

    def parameters(self):
        return iter([self.logits])

    def save(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        torch.save(self.logits.detach().clone(), os.path.join(directory, "logits.pt"))

    def load(self, directory: str) -> None:
        with torch.no_grad():
            self.logits.copy_(torch.load(os.path.join(directory, "logits.pt")))


class ScriptedPolicy(Policy):
    """Sample g of every prompt is the text ``str(g)``: fully predictable trees."""

    def __init__(self) -> None:
        self.generate_calls: list[tuple[int, int]] = []

    def generate(self, prompts, num_samples=1, generation_config=None, seed=None):
        self.generate_calls.append((len(prompts), num_samples))
        return [[Completion(str(g), [g + 1], "eos", [1]) for g in range(num_samples)] for _ in prompts]


class CountingEnv:
    """A duck-typed text ParallelEnv with shared counters of steps, batches and clones."""

    possible_agents = ["a0", "a1"]

    def __init__(
        self,
        num_turns: int = 1,
        early_termination_threshold: float | None = None,
        reward_fn: Callable[[int, dict, int], float] | None = None,
        agents: Sequence[str] | None = None,
        num_tasks: int = 5,
        counter: dict | None = None,
    ) -> None:
        if agents is not None:
            self.possible_agents = list(agents)
        self.num_turns = num_turns
        self.threshold = early_termination_threshold
        self.reward_fn = reward_fn or (lambda task, actions, turn: 0.0)
        self.num_tasks = num_tasks
        self.counter = counter if counter is not None else {"steps": 0, "batches": 0, "clones": 0, "resets": 0}
        self.agents: list[str] = []
        self.task = 0
        self.turn = 0
        self.history: list[dict] = []

    def reset(self, seed=None, options=None):
        self.counter["resets"] += 1
        self.task = int((options or {}).get("task", 0))
        self.turn, self.history, self.agents = 0, [], list(self.possible_agents)
        return {a: f"task{self.task} turn1 {a}" for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        self.counter["steps"] += 1
        reward = float(self.reward_fn(self.task, actions, self.turn))
        self.turn += 1
        self.history.append(dict(actions))
        term = self.threshold is not None and reward >= self.threshold
        trunc = self.turn >= self.num_turns
        agents = list(self.agents)
        obs = {a: f"task{self.task} turn{self.turn + 1} {a} prev={actions[a]}" for a in agents}
        if term or trunc:
            self.agents = []
        return (
            obs,
            {a: reward for a in agents},
            {a: term for a in agents},
            {a: trunc and not term for a in agents},
            {a: {"turn": self.turn} for a in agents},
        )

    @classmethod
    def step_many(cls, envs, actions_list):
        envs[0].counter["batches"] += 1
        return [env.step(a) for env, a in zip(envs, actions_list, strict=True)]

    def clone(self):
        self.counter["clones"] += 1
        twin = copy.copy(self)
        twin.history = list(self.history)
        twin.agents = list(self.agents)
        return twin

    def state(self) -> str:
        return repr(self.history)


class FakeTeam:
    """Just enough of a Team: ordered policies."""

    def __init__(self, policies: Sequence[Policy]) -> None:
        self.policies = list(policies)

    def __len__(self) -> int:
        return len(self.policies)

    def __iter__(self):
        return iter(self.policies)

    def __getitem__(self, i):
        return self.policies[i]

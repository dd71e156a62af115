"""Fakes for the preference tests: a bigram policy that can tokenise text completions."""

from __future__ import annotations

from magrpo_fakes import BigramPolicy, CountingEnv, FakeTeam  # noqa: F401  (re-exported)


class TextBigram(BigramPolicy):
    """BigramPolicy plus ``encode_completion`` so comparator texts can be scored."""

    def encode_completion(self, text: str) -> list[int]:
        return [1 + (ord(c) % (self.vocab - 1)) for c in text[:6]] + [0]


def env_factory(reward_fn, num_tasks: int = 3, counter=None):
    def make(**kw):
        return CountingEnv(reward_fn=reward_fn, num_tasks=num_tasks, counter=counter, num_turns=kw.get("num_turns", 1))

    return make


def a_fraction(task, actions, turn):
    text = "".join(actions.values())
    return text.count("a") / max(1, len(text))


def clear_preference(i: int):
    """Pair ``i`` of an easy preference for a reward model: a ``good answer`` beats ``zzz``
    on the same two-agent prompts."""
    from learners.preference.records import PreferencePair

    return PreferencePair([f"task {i}", "x"], [f"good answer {i}", "fine"], [f"zzz {i}", "qq"], 1.0, 0.0, 0.5)

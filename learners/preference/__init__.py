"""Preference machinery shared by MADPO and MARLHF: pairs from task items, records, oracles,
comparators, the replay buffer and the iterative round loop."""

from learners.preference.oracles import CallableOracle, JointOracle, JudgeParseError, LLMJudgeOracle, OracleError
from learners.preference.pairs import PAIR_SELECTIONS, Comparison, select_comparisons, select_pairs
from learners.preference.records import PreferencePair, read_round, write_round
from learners.preference.replay import ReplayBuffer, apportion, draw_from_round, lambda_weights

__all__ = [
    "CallableOracle",
    "Comparison",
    "JointOracle",
    "JudgeParseError",
    "LLMJudgeOracle",
    "OracleError",
    "PAIR_SELECTIONS",
    "PreferencePair",
    "ReplayBuffer",
    "apportion",
    "draw_from_round",
    "lambda_weights",
    "read_round",
    "select_comparisons",
    "select_pairs",
    "write_round",
]

"""Writing-v0: a summarizer and an expander write complementary texts (see ``envs.writing.env``)."""

from envs.writing.env import EXPANDER, SUMMARIZER, WritingEnv
from envs.writing.reward import MAX_REWARD, WritingRewardConfig, score_writing

__all__ = ["EXPANDER", "MAX_REWARD", "SUMMARIZER", "WritingEnv", "WritingRewardConfig", "score_writing"]

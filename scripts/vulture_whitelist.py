"""Names vulture (scripts/check.sh) must not report: used from outside this code, not dead.

Vulture sees only the four packages, not the tests, so a function that only its tests call
is reported: that is the point. Each entry below is used by Python itself, by a library we
hand our objects to, or by users through documented API. It is type-checked (mypy reads it),
so an entry whose name is renamed or removed fails the check. Never executed.

Add a name only with the reason it is used; dead code gets deleted instead.
"""

import sys

from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerBase

import comlrl_core
from comlrl_core._moved import _MovedModuleFinder
from comlrl_core.episodes.evaluation import TaskResult
from comlrl_core.episodes.intervals import DiffInterval
from comlrl_core.models.cpu.allocator import preload_env
from comlrl_core.models.cpu.decode_attention import kernel_status
from comlrl_core.models.cpu.fp32_layout import measured
from comlrl_core.models.model_source import known_aliases
from comlrl_core.models.team import Team
from comlrl_core.policy import Policy
from comlrl_core.remote.client import RemoteModelClient
from comlrl_core.run.metrics import MetricsLogger
from envs.base import TextParallelEnv
from envs.code.program import reference_solution
from envs.code.tasks import EASY_HELD_OUT_SLICE, EASY_TRAIN_SLICE
from learners.actor_critic.ac_trainer import UpdateRecord
from learners.common.distributed import DistributedContext, NullLogger
from learners.common.trainer_utils import TrainerCommon
from learners.magrpo.groups import NodeGroup
from learners.magrpo.tree import build_tree
from sandbox.sandbox import Sandbox
from sandbox.types import Result, Status

# Python protocols: PEP 562 module __getattr__ (lazy names, moved-module aliases), importlib's Loader.
comlrl_core.__getattr__
_MovedModuleFinder.create_module
_MovedModuleFinder.exec_module
# Interpreter settings read by Python itself (set in the sandbox's program child).
sys.dont_write_bytecode
sys.pycache_prefix

# PettingZoo's ParallelEnv API, called by PettingZoo tools and users' code.
TextParallelEnv.observation_space
TextParallelEnv.action_space
TextParallelEnv.render


# Documented API: the policy contract (docs/design.md), the modules' API summaries, the
# sandbox (docs/sandbox.md), data-parallel sharding (docs/distributed.md).
Policy.sequence_logprobs
known_aliases  # listed in comlrl_core/models/model_source.py's API summary
Team.shared_groups  # listed in comlrl_core/models/team.py's API summary
Sandbox.run_one
Result.stdout_truncated
Result.stderr_truncated
Result.pass_rate
Status.FAILED
Status.ERROR
Status.TIMEOUT
Status.MEMORY
DistributedContext.shard
TrainerCommon.from_components  # the CoMLRL-style constructor (docs/learners.md)


def _instance_attributes(  # vulture: ignore_names in pyproject.toml
    hf_tokenizer: PreTrainedTokenizerBase,
    bpe: Tokenizer,
    task: TaskResult,
    group: NodeGroup,
    record: UpdateRecord,
    interval: DiffInterval,
) -> None:
    # Set on tokenizer objects and read by transformers / tokenizers.
    hf_tokenizer.pad_token
    bpe.pre_tokenizer
    # Fields of records users read or that are written out whole (asdict / to_dict).
    task.task_index
    task.num_passed
    task.final_rewards
    group.mean_reward
    group.mean_return
    record.num_episodes
    interval.num_problems  # DiffInterval: written out whole into eval.json


RemoteModelClient.complete_batch  # in the client's usage summary (comlrl_core/remote/client.py)
MetricsLogger.log_text  # MetricsLogger is exported by comlrl_core; docs/logging.md
MetricsLogger.log_table
NullLogger.log_text  # the non-zero ranks' stand-in must offer the same methods
NullLogger.log_table
# A task's known-good answer as a CoopCode program: bench/env_step.py and the tests score it
# to check the env and the sandbox (a harness a user needs too, e.g. to validate a new task set).
reference_solution
# The easy problem set's fixed split, public constants documented in envs/code/tasks.py (the
# main job spells the same slices in its defaults: learners may not import envs).
EASY_TRAIN_SLICE
EASY_HELD_OUT_SLICE
# One MAGRPO tree from one reset env: the public single-tree form of build_forest (the
# trainer builds forests; users and the tests build single trees).
build_tree
# Public: the environment that starts a child process on tcmalloc / jemalloc (bench/memory_probe.py
# and users' launchers; bench/ is not scanned).
preload_env
# Public: the fp32 layout measurements of this process (bench/generate.py prints them; bench/
# is not scanned).
measured
# Public: whether the decoding attention kernel runs in this process, else why not
# (bench/generate.py prints it; bench/ is not scanned).
kernel_status

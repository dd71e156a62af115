"""MADPOTrainer: multi-agent DPO on preference pairs collected from task items.

``train()``:

1. collect pairs (:meth:`PreferenceTrainerBase.collect_pairs`): every agent samples
   ``preference_num_candidates`` responses per training task, the task reward scores the
   aligned joint responses, ``pair_selection`` keeps up to ``preference_pairs_per_sample``
   untied pairs per task;
2. if there is no pair at all, stop without updating;
3. ``num_train_epochs`` passes over the pairs in a seeded random order, one optimizer step
   per agent per ``train_batch_size`` pairs (:func:`learners.madpo.madpo_loss.madpo_update`).

``generation_mode='centralized'`` (CoMLRL's centralized MADPO): only the actor
(``centralized_agent_index``) samples, trains and is evaluated: it writes every role in one
tagged response (:func:`learners.preference.comparators.sample_centralized`), the oracle
scores the parsed roles, and each pair's margin is the actor's over the whole response.
``preference/centralized_dropped`` / ``_partial`` count responses without any / with some
missing role section.

``turn_1/reward_mean`` and ``turn_1/expected_return`` of an update are the mean
``candidate_reward_mean`` of its pairs: the candidates' rewards recorded when the pairs
were collected (as CoMLRL documents), not a fresh rollout. ``eval/...`` metrics come from
new episodes scored with the task reward.

[distributed] Under a multi-process launcher (``accelerate launch`` / ``torchrun``) every
process collects the pairs of every ``world``-th task batch, and each update is the union
of every process's ``b``-th local batch: gradients are summed over the processes with the
loss divided by the global pair count (:mod:`learners.common.distributed`), so
``train_batch_size`` pairs are per process. Only rank 0 writes logs and checkpoints.
"""

from __future__ import annotations

import json
import pathlib
import random
import time
from typing import Any, Callable, Sequence

from comlrl_core.run.checkpoint import checkpoint_path, read_extra_file, save_checkpoint
from comlrl_core.run.metrics import MetricsLogger
from comlrl_core.run.progress import progress
from learners.common.distributed import DistributedContext, trainable_parameters
from learners.common.nonfinite import halt_if_nonfinite
from learners.common.optim import adamw, adamw_settings
from learners.common.seeding import derive_seed
from learners.common.setup import check_team_fits_env, host_memory_managed, num_tasks
from learners.common.trainer_utils import (
    add_rank_files,
    agent_entries,
    checkpoint_keep_last,
    load_own_checkpoint,
    rank_file_to_read,
)
from learners.madpo.madpo_config import MADPOConfig
from learners.madpo.madpo_loss import madpo_update
from learners.preference.build import completion_ids, with_token_ids
from learners.preference.candidates import (
    JointCandidate,
    Oracle,
    TaskCandidates,
    TaskRewardOracle,
    close_tasks,
    reset_tasks,
    score_tasks,
)
from learners.preference.comparators import ParseCounts, centralized_prompt, render_centralized, sample_centralized
from learners.preference.oracles import JointOracle
from learners.preference.records import PreferencePair
from learners.preference.trainer_base import RESET, SHUFFLE, PreferenceTrainerBase

EVAL_RESET = 18  # seed-path tag of the centralized evaluation's resets


class MADPOTrainer(PreferenceTrainerBase):
    """``MADPOTrainer(config, team, env)``; ``env`` is a registered id or a factory."""

    algorithm_name = "MADPO"
    config_class = MADPOConfig
    config: MADPOConfig  # the base's __init__ checks the config against config_class
    data_parallel = True

    def __init__(
        self,
        config: MADPOConfig,
        team: Any,
        env: str | Callable[..., Any],
        *,
        logger: MetricsLogger | None = None,
        oracle: JointOracle | None = None,
    ) -> None:
        self.distributed = DistributedContext.current()  # [distributed]
        super().__init__(config, team, env, logger=logger, oracle=oracle)
        self.centralized = config.generation_mode == "centralized"
        if self.centralized and config.centralized_agent_index >= len(self.policies):
            raise ValueError(
                f"centralized_agent_index={config.centralized_agent_index} but the team has "
                f"{len(self.policies)} policies"
            )
        # the policies the loss trains: the actor alone when centralized
        self.trained_policies = [self.policies[config.centralized_agent_index]] if self.centralized else self.policies
        self.parse_counts = ParseCounts()  # centralized: responses without / with missing sections
        self.optimizers = []
        for i, policy in enumerate(self.trained_policies):
            params = [p for p in policy.parameters() if p.requires_grad]
            if not params:
                raise ValueError(
                    f"agent {i} ({policy.name}) has no trainable parameters; {self.algorithm_name} trains every agent"
                )
            self.optimizers.append(adamw(params, lr=config.agent_learning_rate, **adamw_settings(config)))
        # [distributed] identical replicas: rank 0's trainable weights on every process
        self.distributed.broadcast_parameters(p for o in self.optimizers for p in trainable_parameters(o))
        self.pairs: list[PreferencePair] | None = None  # None: not collected yet
        self.round = 0  # which pair set the epoch/batch cursor refers to (iterative trainers)
        self.epoch = 0
        self.batch_in_epoch = 0
        self.skipped_nonfinite = 0
        self.finished = False

    def _check_team(self) -> list[str]:
        # centralized: one actor writes every role, so a team of one model fits any env
        if self.config.generation_mode == "centralized" and len(self.policies) == 1:
            return list(self.env.possible_agents)
        return check_team_fits_env(self.policies, self.env)

    # -- centralized MADPO ------------------------------------------------------------
    def sample_tasks(
        self,
        tasks: Sequence[int],
        policies: Sequence[Any],
        num_candidates: int,
        seed_key: Sequence[int],
        oracle: Oracle,
    ) -> list[TaskCandidates]:
        if not self.centralized:
            return super().sample_tasks(tasks, policies, num_candidates, seed_key, oracle)
        c = self.config
        batch = reset_tasks(self.env, tasks, self.agent_names, [derive_seed(c.seed, RESET, t) for t in tasks])
        counts = sample_centralized(
            batch,
            self.trained_policies[0],
            self.agent_names,
            num_candidates,
            self.generation_config(),
            derive_seed(c.seed, *seed_key, c.centralized_agent_index),
            keep_token_ids=True,
        )
        self.parse_counts.dropped += counts.dropped
        self.parse_counts.partial += counts.partial
        score_tasks(oracle, batch)
        return batch

    def _training_ids(self, pair: PreferencePair) -> PreferencePair:
        """``pair`` with token ids for the trained policies (centralized: the actor's one
        sequence; a pair read without ids is re-rendered in the tag format)."""
        if not self.centralized:
            return with_token_ids(pair, self.policies)
        if pair.has_token_ids:
            return pair
        actor = self.trained_policies[0]
        pair.prompt_ids = [list(actor.encode_prompt(centralized_prompt(pair.prompts, self.agent_names)))]
        pair.winner_ids = [completion_ids(actor, render_centralized(pair.winner_completions))]
        pair.loser_ids = [completion_ids(actor, render_centralized(pair.loser_completions))]
        return pair

    def evaluate(self) -> dict[str, float]:
        """Decentralized: the base's episodes. Centralized: the actor answers each evaluation
        task ``eval_episodes_per_task`` times; the TASK reward scores the parsed roles (a
        response without any section as every role empty)."""
        if not self.centralized:
            return super().evaluate()
        c = self.config
        if self._eval_env is None:
            self._eval_env = self._make_env(c.eval_task_slice) if c.eval_task_slice else self.env
        tasks = list(range(min(c.eval_num_samples, num_tasks(self._eval_env))))
        if not tasks:
            return {}
        batch = reset_tasks(
            self._eval_env, tasks, self.agent_names, [derive_seed(c.seed, EVAL_RESET, t) for t in tasks]
        )
        counts = sample_centralized(
            batch,
            self.trained_policies[0],
            self.agent_names,
            c.eval_episodes_per_task,
            self._eval_generation_config(),
            derive_seed(c.seed, EVAL_RESET),
            keep_token_ids=False,
        )
        empty = [""] * len(self.agent_names)
        for task in batch:
            task.candidates = [cand or JointCandidate(completions=list(empty)) for cand in task.candidates]
        score_tasks(TaskRewardOracle(self.agent_names), batch)
        rewards = [r for task in batch for r in task.scored_rewards()]
        metrics = {
            "eval/turn_1/reward_mean": sum(rewards) / len(rewards),
            "eval/centralized_dropped": float(counts.dropped),
            "eval/centralized_partial": float(counts.partial),
        }
        close_tasks(batch)
        self._log(metrics)
        return metrics

    # -- [distributed] (only rank 0 writes logs: the base's logger asks self.distributed) --
    def owns_task_batch(self, index: int) -> bool:
        return self.distributed.owns(index)

    def _global_count(self, items: Sequence[Any] | None) -> int:
        return int(self.distributed.sum([len(items or [])])[0])

    def _reduce_collect_stats(self, stats: dict[str, float]) -> dict[str, float]:
        counts = ("preference/num_pairs", "preference/tasks_without_pairs")
        summed = dict(zip(counts, self.distributed.sum([stats[k] for k in counts]), strict=True))
        return {**self.distributed.reduce_metrics(stats), **summed}

    # -- training -------------------------------------------------------------------
    @host_memory_managed
    def train(self, stop_after: int | None = None) -> dict[str, float]:
        """Collect pairs (once), then train on them; ``stop_after`` pauses after that many
        updates in total (a checkpoint can then be saved and resumed)."""
        if self.pairs is None:
            self.pairs, stats = self.collect_pairs()
            if self.centralized:
                stats["preference/centralized_dropped"] = float(self.parse_counts.dropped)
                stats["preference/centralized_partial"] = float(self.parse_counts.partial)
            self._log(self._reduce_collect_stats(stats))
        if not self._global_count(self.pairs):  # [distributed] all processes stop together
            self.finished = True
            return {}
        last = self.train_on_pairs(self.pairs, stop_after=stop_after)
        if self.epoch >= self.config.num_train_epochs:
            self._finish()
        return last

    def train_on_pairs(self, pairs: Sequence[PreferencePair], stop_after: int | None = None) -> dict[str, float]:
        """Epochs over ``pairs`` from the current (epoch, batch) cursor."""
        c = self.config
        pairs = [self._training_ids(p) for p in pairs]
        size = c.train_batch_size
        per_epoch = (len(pairs) + size - 1) // size
        per_epoch = int(self.distributed.max([per_epoch])[0])  # [distributed] same count everywhere
        last: dict[str, float] = {}
        bar = progress(
            total=per_epoch * c.num_train_epochs,
            initial=self.epoch * per_epoch + self.batch_in_epoch,
            desc=self.algorithm_name,
            disable=None if c.progress_bar is None else not c.progress_bar,
            unit="update",
        )
        try:
            while self.epoch < c.num_train_epochs:
                order = list(range(len(pairs)))
                random.Random(derive_seed(c.seed, SHUFFLE, self.round, self.epoch)).shuffle(order)
                while self.batch_in_epoch < per_epoch:
                    if stop_after is not None and self.global_step >= stop_after:
                        return last
                    if c.eval_interval and self.global_step % c.eval_interval == 0:
                        self.evaluate()
                    start = self.batch_in_epoch * size
                    # the rate of this update (lr_scheduler_type; iterative: every round alike)
                    self._apply_lr_schedule(per_epoch * c.num_train_epochs * getattr(c, "num_iterations", 1))
                    last = self.update([pairs[i] for i in order[start : start + size]])
                    halt_if_nonfinite(agent_entries(self.optimizers), self.global_step, self.run_dir / "checkpoints")
                    self.batch_in_epoch += 1
                    bar.update(1)
                    if getattr(c, "save_steps", 0) and self.global_step % c.save_steps == 0:
                        self.save_checkpoint()
                self.epoch += 1
                self.batch_in_epoch = 0
        finally:
            bar.close()
        return last

    def update(self, batch: Sequence[PreferencePair]) -> dict[str, float]:
        c = self.config
        t0 = time.perf_counter()
        for p in self.trained_policies:
            if hasattr(p, "train"):
                p.train()
        # [distributed] global pair count and reward sum (a process's batch may be empty)
        count, reward_sum = self.distributed.sum([len(batch), sum(p.candidate_reward_mean for p in batch)])
        result = madpo_update(
            self.trained_policies,
            self.optimizers,
            batch,
            c.dpo_beta,
            exclude_last_token=c.exclude_last_token,
            micro_batch_size=c.logprob_micro_batch_size,
            token_budget=c.logprob_token_budget,
            max_grad_norm=c.max_grad_norm,
            pair_count=int(count),
            distributed=self.distributed,
        )
        self.global_step += 1
        reward_mean = reward_sum / count
        metrics = {
            "turn_1/reward_mean": reward_mean,
            "turn_1/expected_return": reward_mean,
            "time/update_s": time.perf_counter() - t0,
        }
        if result.skipped:
            self.skipped_nonfinite += 1
        else:
            metrics.update({"loss": result.loss, "preference/accuracy": result.accuracy})
            indices = [c.centralized_agent_index] if self.centralized else range(len(self.policies))
            metrics.update({f"agent_{i}/margin": m for i, m in zip(indices, result.margin_means, strict=True)})
        metrics["skipped_nonfinite"] = float(self.skipped_nonfinite)
        if self.global_step % c.logging_steps == 0:
            self._log(metrics)
        return metrics

    def _finish(self) -> None:
        self.finished = True
        if self.config.eval_interval:
            self.evaluate()
        if self.config.save_final_checkpoint:
            self.save_checkpoint()
        if self.distributed.is_main:  # [distributed]
            self.plot_rewards()

    # -- checkpoints ----------------------------------------------------------------
    def _cursor(self) -> dict[str, Any]:
        return {
            "algorithm": self.algorithm_name,
            "global_step": self.global_step,
            "round": self.round,
            "epoch": self.epoch,
            "batch_in_epoch": self.batch_in_epoch,
            "skipped_nonfinite": self.skipped_nonfinite,
            "finished": self.finished,
        }

    def _extra_files(self) -> dict[str, bytes]:
        pairs = None if self.pairs is None else [p.to_record() for p in self.pairs]
        return {"pairs.json": json.dumps(pairs).encode()}

    def _restore(self, cursor: dict[str, Any], path: pathlib.Path) -> None:
        self.global_step = int(cursor["global_step"])
        self.round, self.epoch = int(cursor["round"]), int(cursor["epoch"])
        self.batch_in_epoch = int(cursor["batch_in_epoch"])
        self.skipped_nonfinite = int(cursor["skipped_nonfinite"])
        self.finished = bool(cursor["finished"])
        name = rank_file_to_read(self.distributed, cursor, path, "pairs.json")  # [distributed] per process
        raw = json.loads(read_extra_file(path, name))
        self.pairs = None if raw is None else [PreferencePair.from_record(r) for r in raw]

    def save_checkpoint(self, directory: str | pathlib.Path | None = None) -> pathlib.Path:
        """Policies, optimizers, pairs and the training cursor, atomically."""
        path = directory or checkpoint_path(self.run_dir / "checkpoints", self.global_step)
        cursor, extra = self._cursor(), self._extra_files()
        if not add_rank_files(self.distributed, cursor, extra, "pairs.json"):  # [distributed] rank 0 writes
            return pathlib.Path(path)
        return save_checkpoint(
            path,
            policies=agent_entries(self.policies),
            optimizers=agent_entries(self.optimizers),
            cursor=cursor,
            extra_files=extra,
            keep_last=checkpoint_keep_last(self.config, path),  # save_total_limit
        )

    def resume_from_checkpoint(self, directory: str | pathlib.Path | None = None) -> pathlib.Path:
        """Restore a checkpoint (default: the latest complete one under ``output_dir``)."""
        path, cursor = load_own_checkpoint(
            self.run_dir,
            directory,
            self.algorithm_name,
            policies=agent_entries(self.policies),
            optimizers=agent_entries(self.optimizers),
        )
        self._restore(cursor, path)
        return path

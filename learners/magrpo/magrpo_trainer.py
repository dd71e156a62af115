"""MAGRPOTrainer: multi-agent GRPO on tree rollouts of any registered text environment.

One training step = ``tasks_per_step`` task items (default one): reset an env on each
task, expand their rollout trees together (:mod:`learners.magrpo.tree`), compute returns
and per-agent credit (:mod:`learners.magrpo.advantages`), push each agent's node groups
into its rollout buffer and update whenever a buffer is full (:mod:`learners.magrpo.update`).

Every random draw is seeded from ``config.seed`` and the step, so a run resumed from a
checkpoint continues exactly like an uninterrupted one.

[distributed] Under a multi-process launcher (``accelerate launch`` / ``torchrun``) every
process handles the ``tasks_per_step`` items from ``(step * world + rank) * tasks_per_step``
of each round, the buffers are checked and flushed together at the end of a round, and
gradients are summed over the processes with losses divided by the global group count;
``global_step`` then counts rounds, and ``train_batch_size`` groups are per process.
Everything that depends on the number of processes goes through one seam,
``self.parallel`` (:mod:`learners.magrpo.data_parallel`), whose single-process implementation changes nothing.
"""

from __future__ import annotations

import json
import math
import pathlib
import random
import time
from typing import Any, Callable

from comlrl_core.models.cpu.memory_stats import GIB, end_of_phase, host_memory_metrics, resident_bytes
from comlrl_core.models.sampling import FORWARD_COUNTER
from comlrl_core.policy import Policy
from comlrl_core.run.checkpoint import checkpoint_path, read_extra_file, save_checkpoint
from comlrl_core.run.metrics import MetricsLogger
from learners.common.distributed import trainable_parameters
from learners.common.optim import adamw, adamw_settings
from learners.common.reference import frozen_reference
from learners.common.seeding import derive_seed
from learners.common.setup import (
    build_env,
    check_team_fits_env,
    num_tasks,
    releases_between_phases,
    team_policies,
    tune_host_memory,
)
from learners.common.trainer_utils import (
    TaskItemTraining,
    TrainerCommon,
    agent_entries,
    checkpoint_keep_last,
    load_own_checkpoint,
    planned_items,
    shuffled_task,
)
from learners.magrpo.advantages import compute_returns
from learners.magrpo.data_parallel import parallel_seam
from learners.magrpo.groups import NodeGroup, forest_metrics, groups_from_tree
from learners.magrpo.magrpo_config import MAGRPOConfig
from learners.magrpo.tree import RolloutTree, TreeRoot, build_forest
from learners.magrpo.update import update_agent

# Seed-path tags: keep the random streams of different purposes apart.
_TREE, _RESET, _SHUFFLE, _ORDER, _EVAL = 1, 2, 3, 4, 5


class MAGRPOTrainer(TaskItemTraining, TrainerCommon):
    """``MAGRPOTrainer(config, team, env)`` where ``env`` is a registered id or a factory.

    A factory is called with the env keyword arguments (``num_turns``,
    ``early_termination_threshold``, ``task_slice`` when set, and ``config.env_kwargs``).
    ``reference_policies`` (one per agent) serve the KL term; by default, when
    ``reference_kl_coef > 0``, :func:`learners.common.reference.frozen_reference` makes
    them at start (LoRA: the adapter switched off; full weights: a frozen copy).
    """

    algorithm_name = "MAGRPO"
    config_class: type = MAGRPOConfig
    data_parallel = True
    default_advantage_mode = "mean"

    def __init__(
        self,
        config: MAGRPOConfig,
        team: Any,
        env: str | Callable[..., Any],
        *,
        reference_policies: list[Policy] | None = None,
        logger: MetricsLogger | None = None,
    ) -> None:
        if not isinstance(config, MAGRPOConfig):
            raise TypeError(f"config must be a MAGRPOConfig, got {type(config).__name__}")
        self.config = config
        self._check_run_setup()
        self.advantage_mode = self._resolve_advantage_mode(config.advantage_mode)
        self.team = team
        self.policies = team_policies(team)
        self.retain_heap = tune_host_memory(config, self.policies)
        self.release_memory = releases_between_phases(config, self.policies)
        self._env_spec = env
        self.env = self._make_env(config.train_task_slice)
        self.agent_names = check_team_fits_env(self.policies, self.env)
        self.num_tasks = num_tasks(self.env)
        self._eval_env: Any = None
        self.optimizers = []
        for i, policy in enumerate(self.policies):
            params = [p for p in policy.parameters() if p.requires_grad]
            if not params:
                raise ValueError(f"agent {i} ({policy.name}) has no trainable parameters; MAGRPO trains every agent")
            self.optimizers.append(adamw(params, lr=config.agent_learning_rate, **adamw_settings(config)))
        # [distributed] the one seam; a no-op in one process
        self.parallel = parallel_seam(tasks_per_step=config.tasks_per_step)
        # identical replicas: rank 0's trainable weights on every process
        self.parallel.broadcast_parameters(p for o in self.optimizers for p in trainable_parameters(o))
        self.reference_policies = reference_policies
        if config.reference_kl_coef > 0 and self.reference_policies is None:
            self.reference_policies = [frozen_reference(p) for p in self.policies]
        self.buffers: list[list[NodeGroup]] = [[] for _ in self.policies]
        self.global_step = 0
        self.flush_counts = [0] * len(self.policies)
        self.update_counts = [0] * len(self.policies)
        self.skipped_nonfinite = [0] * len(self.policies)
        self.run_dir = pathlib.Path(config.output_dir)
        self._logger = logger
        self.history: list[dict[str, float]] = []  # every logged metrics dict, with "step"
        self._step_updates: list[list[Any]] = [[] for _ in self.policies]

    # -- setup ----------------------------------------------------------------------
    def _resolve_advantage_mode(self, asked: str | None) -> str:
        if asked is None or asked == self.default_advantage_mode:
            return self.default_advantage_mode
        if type(self) is MAGRPOTrainer:
            return asked
        raise ValueError(
            f"{type(self).__name__} uses advantage_mode={self.default_advantage_mode!r}; "
            f"the config asks for {asked!r}. Use MAGRPOTrainer with advantage_mode={asked!r}, "
            "or leave advantage_mode unset"
        )

    def _env_kwargs(self, task_slice: str | None) -> dict[str, Any]:
        """The env's constructor arguments for the split ``task_slice``."""
        c = self.config
        owned = {"num_turns": c.num_turns, "early_termination_threshold": c.early_termination_threshold}
        clash = sorted(set(owned) & set(c.env_kwargs))
        if clash:
            raise ValueError(f"env_kwargs sets {clash}: use the trainer options of the same name instead")
        kwargs = {**c.env_kwargs, **owned}
        if task_slice is not None:
            kwargs["task_slice"] = task_slice
        return kwargs

    def _make_env(self, task_slice: str | None) -> Any:
        return build_env(self._env_spec, **self._env_kwargs(task_slice))

    @property
    def logger(self) -> MetricsLogger:
        if self._logger is None:  # [distributed] only rank 0 writes
            self._logger = self.parallel.logger(self.run_dir, self.config)
        return self._logger

    @property
    def total_items(self) -> int:
        """Task items of the whole run (all processes together)."""
        return planned_items(self.config.num_train_epochs, self.num_tasks, self.config.max_steps)

    @property
    def total_steps(self) -> int:
        """Steps of this process: task items, or rounds of ``world`` items when distributed."""
        return self.parallel.num_steps(self.total_items)

    def task_for_step(self, step: int) -> int:
        return shuffled_task(step, self.num_tasks, self.config.shuffle_tasks, self.config.seed, _ORDER)

    # -- training -------------------------------------------------------------------
    def train_step(self) -> dict[str, float]:
        """``tasks_per_step`` task items: rollout trees (built together), returns, buffers,
        updates. Returns the step's metrics."""
        c, step, parallel = self.config, self.global_step, self.parallel
        t0 = time.perf_counter()
        FORWARD_COUNTER.take()  # count this step's sampling passes only
        # the global items; [distributed] the last round may leave a process with fewer or none
        items = [item for item in parallel.items_of_step(step) if item < self.total_items]
        tasks = [self.task_for_step(item) for item in items]
        roots = []
        for item, task in zip(items, tasks, strict=True):
            env = self.env if len(items) == 1 else self.env.clone()
            obs, _ = env.reset(seed=derive_seed(c.seed, _RESET, item), options={"task": task})
            roots.append(TreeRoot(env, [obs[a] for a in self.agent_names], derive_seed(c.seed, _TREE, item)))
        trees: list[RolloutTree] = build_forest(
            roots,
            self.policies,
            self.agent_names,
            num_generations=c.num_generations,
            num_turns=c.num_turns,
            joint_mode=c.joint_mode,
            generation_config=self.generation_config(),
        )
        for tree in trees:
            compute_returns(tree, c.discount)
        rollout_rss = resident_bytes() / GIB  # before the release: the rollout's own footprint
        end_of_phase()
        t1 = time.perf_counter()
        passes, rows = FORWARD_COUNTER.take()
        self._step_updates = [[] for _ in self.policies]
        # each agent's groups in item order; one call per step ([distributed] a collective)
        new_groups: list[list[NodeGroup]] = [[] for _ in self.policies]
        for tree in trees:
            for agent, groups in enumerate(groups_from_tree(tree, self.policies)):
                new_groups[agent].extend(groups)
        parallel.add_groups(self.buffers, new_groups, c.rollout_buffer_size, self._flush)
        per_step = parallel.items_per_step
        last_item = min((step + 1) * per_step, self.total_items)  # items done after this step
        epoch_end = last_item // self.num_tasks > (step * per_step) // self.num_tasks or last_item == self.total_items
        if epoch_end:  # as CoMLRL: no group waits across an epoch boundary
            for agent in range(len(self.policies)):
                self._flush(agent)
        self.global_step = step + 1
        memory = host_memory_metrics()  # before the release: what the allocator kept shows
        end_of_phase()
        metrics = forest_metrics(trees)
        metrics.update(self._agent_metrics())
        if passes:  # the mean batch of the rollout's decoding steps (agents of a shared base together)
            metrics["rollout/rows_per_forward"] = rows / passes
        metrics.update(
            {
                "time/rollout_s": t1 - t0,
                "time/update_s": time.perf_counter() - t1,
                "time/step_s": time.perf_counter() - t0,
            }
        )
        metrics.update(memory)
        metrics["memory/rss_after_rollout_gib"] = rollout_rss
        if tasks:
            metrics["train/task"] = float(tasks[0])
        metrics = parallel.reduce_metrics(metrics)  # [distributed] means over the processes
        if self.global_step % c.logging_steps == 0:
            self._log(metrics)
        return metrics

    def _flush(self, agent: int) -> None:
        """Update ``agent`` on its buffer: per turn, shuffled mini-batches of
        ``groups_per_update`` groups. [distributed] Mini-batch ``b`` is the union of every
        process's ``b``-th local one (a process with fewer joins with none), its loss divided
        by the global group count."""
        c, parallel = self.config, self.parallel
        buffer, self.buffers[agent] = self.buffers[agent], []
        size = c.groups_per_update
        by_turn = [[g for g in buffer if g.turn == t] for t in range(1, c.num_turns + 1)]
        if sum(len(gs) for gs in by_turn) != len(buffer):
            raise ValueError(f"agent {agent}'s buffer holds groups of turns outside 1..{c.num_turns}")
        num_batches = parallel.batch_counts([math.ceil(len(gs) / size) for gs in by_turn])
        if not any(num_batches):
            return
        rng = random.Random(derive_seed(c.seed, _SHUFFLE, agent, self.flush_counts[agent]))
        self.flush_counts[agent] += 1
        for groups, count in zip(by_turn, num_batches, strict=True):
            rng.shuffle(groups)
            for b in range(count):
                batch = groups[b * size : (b + 1) * size]
                self._update(agent, batch, group_count=parallel.global_count(len(batch)))

    def _update(self, agent: int, groups: list[NodeGroup], group_count: int | None = None) -> None:
        c = self.config
        result = update_agent(
            self.policies[agent],
            self.optimizers[agent],
            groups,
            advantage_mode=self.advantage_mode,
            normalize_advantage=c.normalize_advantage,
            micro_batch_size=c.logprob_micro_batch_size,
            token_budget=c.logprob_token_budget,
            step=self.global_step,
            agent=agent,
            reference=self.reference_policies[agent] if self.reference_policies else None,
            reference_kl_coef=c.reference_kl_coef,
            skip_nonfinite=c.skip_nonfinite,
            max_grad_norm=c.max_grad_norm,
            group_count=group_count,
            sync_gradients=self.parallel.sync_gradients,  # [distributed]
        )
        if result.skipped:
            self.skipped_nonfinite[agent] += 1
        else:
            self.update_counts[agent] += 1
        self._step_updates[agent].append(result)

    def _agent_metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for i, results in enumerate(self._step_updates):
            done = [r for r in results if not r.skipped]
            if done:
                out[f"agent_{i}/loss"] = sum(r.loss for r in done) / len(done)
                out[f"agent_{i}/advantage_abs_mean"] = sum(r.advantage_abs_mean for r in done) / len(done)
                kls = [r.kl_mean for r in done if r.kl_mean is not None]
                if kls:
                    out[f"agent_{i}/kl"] = sum(kls) / len(kls)
            total = sum(r.num_groups for r in results)
            if total:  # groups of this step's updates with nothing to learn (not scored)
                out[f"agent_{i}/zero_advantage_frac"] = sum(r.zero_advantage_groups for r in results) / total
            out[f"agent_{i}/updates"] = float(self.update_counts[i])
            out[f"agent_{i}/skipped_nonfinite"] = float(self.skipped_nonfinite[i])
        return out

    def _finish(self) -> None:
        for agent in range(len(self.policies)):
            self._flush(agent)
        if self.config.eval_interval:
            self.evaluate()
        if self.config.save_final_checkpoint:
            self.save_checkpoint()
        if self.parallel.is_main:  # [distributed]
            self.plot_rewards()

    def plot_rewards(self) -> pathlib.Path | None:
        """``reward_curve.png`` in the run folder (needs matplotlib; skipped without it)."""
        return self._plot_reward_curve(f"turn_{t}/reward_mean" for t in range(1, self.config.num_turns + 1))

    # -- evaluation -----------------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        """Run ``eval_num_samples`` evaluation tasks (one path each) and log ``eval/...``."""
        c = self.config
        return self._evaluate_episodes(c.num_turns, c.discount)

    # -- checkpoints ----------------------------------------------------------------
    def save_checkpoint(self, directory: str | pathlib.Path | None = None) -> pathlib.Path:
        """Policies, optimizers, buffers and counters, atomically (default:
        ``output_dir/checkpoints/checkpoint-<step>``)."""
        path = directory or checkpoint_path(self.run_dir / "checkpoints", self.global_step)
        cursor = {
            "algorithm": self.algorithm_name,
            "global_step": self.global_step,
            "flush_counts": self.flush_counts,
            "update_counts": self.update_counts,
            "skipped_nonfinite": self.skipped_nonfinite,
        }
        buffers = json.dumps([[g.to_dict() for g in buf] for buf in self.buffers]).encode()
        extra = {"buffers.json": buffers}
        if not self.parallel.share_file(cursor, extra, "buffers.json"):  # [distributed] rank 0 writes
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
        self.global_step = int(cursor["global_step"])
        self.flush_counts = list(cursor["flush_counts"])
        self.update_counts = list(cursor["update_counts"])
        self.skipped_nonfinite = list(cursor["skipped_nonfinite"])
        name = self.parallel.file_to_read(cursor, path, "buffers.json")  # [distributed] per process
        raw = json.loads(read_extra_file(path, name))
        self.buffers = [[NodeGroup.from_dict(g) for g in buf] for buf in raw]
        return path

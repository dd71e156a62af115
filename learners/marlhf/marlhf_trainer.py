"""MARLHFTrainer: task items -> preference pairs -> JointRewardModel -> RL with its reward.

``train()``:

1. collect pairs with the TASK reward (as MADPO does); stop without updating if there are none;
2. fit a fresh :class:`JointRewardModel` with Bradley-Terry on them, then freeze it;
3. build the RL backend (``rl_algorithm``: MAGRPO, MAREINFORCE, MARLOO, MAReMax, MAAC or
   IAC) on a factory of :class:`RewardModelEnv` wrappers, so every team reward it sees is
   the reward model's score, and train it (its run folder: ``output_dir/rl``);
4. evaluate with the task reward.

Evaluation never uses the reward model: the backend's own periodic evaluations run with
the replacement switched off, and :meth:`evaluate` uses the unwrapped env.
"""

from __future__ import annotations

import io
import json
import pathlib
import time
from typing import Any, Callable

import torch

from comlrl_core.config.options import BaseConfig, field_types
from comlrl_core.run.checkpoint import checkpoint_path, read_extra_file, save_checkpoint
from comlrl_core.run.metrics import MetricsLogger
from comlrl_core.run.seeds import torch_seeded
from learners.catalog import learner_classes
from learners.common.reference import frozen_references
from learners.common.seeding import derive_seed
from learners.common.setup import host_memory_managed
from learners.common.trainer_utils import agent_entries, checkpoint_keep_last, load_own_checkpoint
from learners.marlhf.marlhf_config import MAGRPO_FAMILY, RL_ALGORITHMS, MARLHFConfig
from learners.marlhf.reward_env import RewardSwitch, reward_model_env_factory
from learners.marlhf.reward_model import JointRewardModel
from learners.preference.oracles import JointOracle
from learners.preference.records import PreferencePair
from learners.preference.trainer_base import PreferenceTrainerBase

_FIT = 21

# Options copied from the MARLHF config into the backend's config when it has them.
_SHARED_OPTIONS = (
    "num_generations",
    "num_train_epochs",
    "max_steps",
    "rollout_buffer_size",
    "train_batch_size",
    "reference_kl_coef",
    "critic_type",
    "critic_model",
    "critic_learning_rate",
    "use_separate_critic",
    "value_loss_coef",
    "value_clip_range",
    "agent_learning_rate",
    "weight_decay",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "lr_scheduler_type",
    "warmup_steps",
    "warmup_ratio",
    "save_total_limit",
    "stop",
    "max_grad_norm",
    "logprob_micro_batch_size",
    "max_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "eval_interval",
    "eval_num_samples",
    # the backend's evaluations (before / after RL) must play the same episodes as MARLHF's
    # own final one, so that they pair by (task, sample)
    "eval_episodes_per_task",
    "eval_k",
    "eval_temperature",
    "logging_steps",
    "seed",
    "progress_bar",
    "env_kwargs",
    "train_task_slice",
    "eval_task_slice",
    "lora",
    "lora_r",
    "lora_alpha",
    "lora_dropout",
    "device",
)


def backend_classes(name: str) -> tuple[type[BaseConfig], type]:
    """``(config class, trainer class)`` of an RL backend."""
    if name not in RL_ALGORITHMS:
        raise ValueError(f"rl_algorithm {name!r} is not an RL backend; choose from {', '.join(RL_ALGORITHMS)}")
    return learner_classes(name)


def _model_source(policy: Any) -> str:
    spec = getattr(policy, "spec", None)
    if spec is not None and getattr(spec, "model", None):
        return spec.model
    raise ValueError("set reward_model_name: agent 0 does not say which model it was loaded from")


class MARLHFTrainer(PreferenceTrainerBase):
    """``MARLHFTrainer(config, team, env)``; ``env`` is a registered id or a factory."""

    algorithm_name = "MARLHF"
    config_class = MARLHFConfig
    config: MARLHFConfig  # the base's __init__ checks the config against config_class

    def __init__(
        self,
        config: MARLHFConfig,
        team: Any,
        env: str | Callable[..., Any],
        *,
        logger: MetricsLogger | None = None,
        oracle: JointOracle | None = None,
    ) -> None:
        super().__init__(config, team, env, logger=logger, oracle=oracle)
        self.reward_model: JointRewardModel | None = None
        self.reward_switch = RewardSwitch(self._score_with_reward_model)
        self.backend: Any = None
        self.pairs: list[PreferencePair] | None = None
        self.finished = False

    # -- reward model -----------------------------------------------------------------
    def _score_with_reward_model(self, items) -> list[float]:
        if self.reward_model is None:
            raise RuntimeError("no reward model has been fitted yet")
        return self.reward_model.score_joint(items)

    def new_reward_model(self) -> JointRewardModel:
        c = self.config
        device = c.reward_model_device or str(getattr(self.policies[0], "device", "cpu"))
        return JointRewardModel.from_source(
            c.reward_model_name or _model_source(self.policies[0]),
            device=device,
            freeze_backbone=c.reward_freeze_backbone,
            max_length=c.reward_max_length,
            agent_names=self.agent_names,
        )

    def fit_reward_model(self, pairs: list[PreferencePair], round_: int = 0) -> dict[str, float]:
        """Replace the reward model by a fresh one fitted on ``pairs``; returns its metrics."""
        c = self.config
        t0 = time.perf_counter()
        self.reward_model = None
        # the head's initialisation (and any dropout of the backbone while fitting) drawn from
        # this round's seed; the caller's global random stream is left as it was
        with torch_seeded(derive_seed(c.seed, _FIT, round_)):
            model = self.new_reward_model()
            result = model.fit(
                pairs,
                epochs=c.reward_num_train_epochs,
                batch_size=c.reward_train_batch_size,
                learning_rate=c.reward_learning_rate,
                seed=derive_seed(c.seed, _FIT, round_, 1),
            )
        model.requires_grad_(False)
        self.reward_model = model
        return {
            "reward_model/loss": result.loss,
            "reward_model/accuracy": result.accuracy,
            "reward_model/steps": float(result.steps),
            "time/reward_model_s": time.perf_counter() - t0,
        }

    # -- RL backend -------------------------------------------------------------------
    def backend_config(self, run_dir: pathlib.Path) -> Any:
        c = self.config
        config_cls, _ = backend_classes(c.rl_algorithm)
        names = field_types(config_cls)
        options = {k: getattr(c, k) for k in _SHARED_OPTIONS if k in names}
        if "reference_kl_coef" in names:  # reference_kl_enabled=false turns the term off
            options["reference_kl_coef"] = c.effective_reference_kl_coef
        options.update({"num_turns": 1, "output_dir": str(run_dir)})
        if "joint_mode" in names:
            options["joint_mode"] = "aligned"
        options.update(c.rl_kwargs)
        return config_cls.from_dict(options)

    def build_backend(self, run_dir: pathlib.Path) -> Any:
        """The RL trainer on reward-model envs; its evaluations use the task reward."""
        c = self.config
        _, trainer_cls = backend_classes(c.rl_algorithm)
        extra: dict[str, Any] = {}
        if c.reference_devices and c.rl_algorithm in MAGRPO_FAMILY and c.effective_reference_kl_coef > 0:
            # the policies as they are at RL start, frozen on the reference devices
            extra["reference_policies"] = frozen_references(self.policies, c.reference_devices)
        backend = trainer_cls(
            self.backend_config(run_dir),
            self.team,
            reward_model_env_factory(self._env_spec, self.reward_switch),
            **extra,
        )
        own_evaluate = backend.evaluate
        switch = self.reward_switch

        def evaluate_with_task_reward() -> dict[str, float]:
            switch.enabled = False
            try:
                return own_evaluate()
            finally:
                switch.enabled = True

        backend.evaluate = evaluate_with_task_reward
        return backend

    def train_policies(self, run_dir: pathlib.Path) -> dict[str, float]:
        self.backend = self.build_backend(run_dir)
        last = self.backend.train()
        self.global_step += int(getattr(self.backend, "global_step", 0))
        return last

    # -- training ---------------------------------------------------------------------
    @host_memory_managed
    def train(self) -> dict[str, float]:
        if self.pairs is None:
            self.pairs, stats = self.collect_pairs()
            self._log(stats)
        if not self.pairs:
            self.finished = True
            return {}
        if self.finished:
            return {}
        self._log(self.fit_reward_model(self.pairs))
        last = self.train_policies(self.run_dir / "rl")
        self._finish()
        return last

    def _finish(self) -> None:
        self.finished = True
        if self.config.eval_interval:
            self.evaluate()
        if self.config.save_final_checkpoint:
            self.save_checkpoint()
        self.plot_rewards()

    # -- checkpoints ------------------------------------------------------------------
    def _cursor(self) -> dict[str, Any]:
        return {"algorithm": self.algorithm_name, "global_step": self.global_step, "finished": self.finished}

    def _extra_files(self) -> dict[str, bytes]:
        files = {"pairs.json": json.dumps(None if self.pairs is None else [p.to_record() for p in self.pairs]).encode()}
        if self.reward_model is not None:
            buffer = io.BytesIO()
            torch.save(self.reward_model.state_dict(), buffer)
            files["reward_model.pt"] = buffer.getvalue()
        return files

    def _restore(self, cursor: dict[str, Any], path: pathlib.Path) -> None:
        self.global_step, self.finished = int(cursor["global_step"]), bool(cursor["finished"])
        raw = json.loads(read_extra_file(path, "pairs.json"))
        self.pairs = None if raw is None else [PreferencePair.from_record(r) for r in raw]
        if (path / "extra" / "reward_model.pt").exists():
            model = self.new_reward_model()
            state = torch.load(
                io.BytesIO(read_extra_file(path, "reward_model.pt")), map_location=model.device, weights_only=True
            )
            model.load_state_dict(state)
            model.requires_grad_(False)
            self.reward_model = model

    def save_checkpoint(self, directory: str | pathlib.Path | None = None) -> pathlib.Path:
        """Policies, the reward model, the pairs and the cursor, atomically."""
        path = directory or checkpoint_path(self.run_dir / "checkpoints", self.global_step)
        return save_checkpoint(
            path,
            policies=agent_entries(self.policies),
            cursor=self._cursor(),
            extra_files=self._extra_files(),
            keep_last=checkpoint_keep_last(self.config, path),  # save_total_limit
        )

    def resume_from_checkpoint(self, directory: str | pathlib.Path | None = None) -> pathlib.Path:
        path, cursor = load_own_checkpoint(
            self.run_dir, directory, self.algorithm_name, policies=agent_entries(self.policies)
        )
        self._restore(cursor, path)
        return path

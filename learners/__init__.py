"""comlrl-gym learners: one package per method family, each driving any registered env.

Learners import only ``comlrl_core``; they reach environments through
``comlrl_core.registry.make`` and the ParallelEnv API (plus ``comlrl_core.env_api``).

* :mod:`learners.magrpo` -- MAGRPO and its baselines MAREINFORCE, MARLOO, MAReMax.
* :mod:`learners.common` -- seeding, env/team access, batched log-prob passes,
  level-batched evaluation, reference policies (shared by every learner).
"""

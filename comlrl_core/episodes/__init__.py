"""Playing episodes of a registered environment with a team: the one episode engine
(:mod:`~comlrl_core.episodes.engine`), its seeding rule, metric vocabulary, saved
evaluation settings and the evaluation built on them (see ``docs/evaluation.md``)."""

"""Machinery shared by the learners: seeding, environment/team access, batched
log-prob gradients, level-batched evaluation rollouts, run logging."""

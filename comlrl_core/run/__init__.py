"""Run machinery shared by trainers: checkpoints, metrics logging, progress bars, RNG state, seeds."""

"""The training run: the K-step fit loop, the run callback, checkpoints, the run dir, preemption, its data."""

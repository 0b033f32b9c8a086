"""The train/validation split.

Whole packed sequences are assigned to validation by a seeded hash of their id, so
the split is deterministic, streaming (no second pass) and independent of how the
corpus is batched or how many processes prepare it.
"""

import numpy as np


def in_validation(indices, fraction, seed):
    """(n,) bool: which of the (n,) sequence `indices` go to validation, splitmix64(seed,
    index) / 2**64 < fraction (`seed` any non-negative int)."""
    with np.errstate(over="ignore"):
        z = np.asarray(indices, dtype=np.uint64) + np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) / float(1 << 53) < fraction

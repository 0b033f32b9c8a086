"""Train/validation split and round-robin shard writing.

Whole packed sequences are assigned to validation by a seeded hash of their index,
so the split is deterministic, streaming (no second pass) and independent of how
the corpus is batched.
"""

import os

import numpy as np

from kroberta.data.records import ShardWriter


def in_validation(indices, fraction, seed):
    """(n,) bool: which of the (n,) sequence `indices` go to validation, splitmix64(seed,
    index) / 2**64 < fraction (`seed` any non-negative int)."""
    with np.errstate(over="ignore"):
        z = np.asarray(indices, dtype=np.uint64) + np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) / float(1 << 53) < fraction


class SplitWriter:
    """Round-robin writers for one split (train or validation) and its counts."""

    def __init__(self, out_dir, name, shards):
        self.out_dir, self.name = out_dir, name
        self.writers = [
            ShardWriter(os.path.join(out_dir, f"{name}-{i:05d}-of-{shards:05d}.tfrecord")) for i in range(shards)
        ]
        self.sequences = 0
        self.tokens = 0

    def write(self, record, tokens):
        """Append a serialized record holding `tokens` real tokens to the next shard."""
        self.writers[self.sequences % len(self.writers)].write(record)
        self.sequences += 1
        self.tokens += tokens

    def finish(self):
        """Closes the non-empty shards under names counting only them, drops the empty
        ones; returns the manifest entry {"files": [names], "sequences": n, "tokens": n}."""
        used = [w for w in self.writers if w.records]
        for w in self.writers:
            if not w.records:
                w.abort()
        names = []
        for i, w in enumerate(used):
            names.append(f"{self.name}-{i:05d}-of-{len(used):05d}.tfrecord")
            w.path = os.path.join(self.out_dir, names[-1])
            w.close()
        return {"files": names, "sequences": self.sequences, "tokens": self.tokens}

    def abort(self):
        """Remove every shard's temporary file (after an error)."""
        for w in self.writers:
            w.abort()

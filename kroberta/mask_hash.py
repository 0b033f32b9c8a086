"""The counter hash dynamic masks are drawn from, shared by its two implementations.

The host's (`kroberta.data.masking`, TF integer ops in the input pipeline) and the
device's (`kroberta.model.device_masking`, JAX inside the training step) must draw
the same masks bit for bit, so they share these constants and rules.
"""

# lowbias32 (a uint32 bijection with good avalanche; the dropout hash's mixer).
MIX_A, MIX_B = 0x7FEB352D, 0x846CA68B
GOLDEN = 0x9E3779B9  # separates the seed words from the index words
# Independent streams of uniforms per element: which positions, what to write, random ids.
SALT_SCORE, SALT_ACTION, SALT_RANDOM_ID = 1, 2, 3
SCORE_BITS = 24  # random scores are integers in [0, 2^24)


def random_id_range(special_token_ids, vocabulary_size: int) -> tuple[int, int]:
    """(lowest, span): the ids the "random token" replacement draws from, lowest ...
    lowest + span - 1, every id above the special tokens."""
    lowest = max(special_token_ids) + 1 if special_token_ids else 0
    return lowest, vocabulary_size - lowest

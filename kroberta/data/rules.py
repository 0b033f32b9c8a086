"""The record format's value rules, one definition for every reader.

Each rule is an elementwise expression that works alike on numpy arrays and on
TF tensors, so the tf.data pipeline (`batch_parsing`), `prepare --check`
(`check`) and predict's in-memory arrays (`kroberta.inference.inputs`) judge a
value the same way. Each returns True where a value breaks the rule.
"""

from kroberta.tokens import IGNORE_LABEL


def bad_id(ids, vocabulary_size=None):
    """Token ids outside [0, vocabulary_size) (only negatives when the size is unknown)."""
    return (ids < 0) if vocabulary_size is None else (ids < 0) | (ids >= vocabulary_size)


def bad_attention(mask):
    """Attention-mask values other than 0 and 1."""
    return (mask != 0) & (mask != 1)


def bad_label(labels, vocabulary_size=None):
    """Labels that are neither IGNORE_LABEL (no loss) nor a token id."""
    return (labels != IGNORE_LABEL) & bad_id(labels, vocabulary_size)

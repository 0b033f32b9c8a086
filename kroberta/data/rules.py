"""What a valid record is: the one definition every reader of the record format checks.

A record (`kroberta.data.records`) is a `tf.train.Example` whose features are all
int64 lists (`FEATURE_KIND`): `input_ids` and `attention_mask` (required) and
`labels` (optional; `records.FEATURES`, `records.REQUIRED_FEATURES`), every one of
the same length L. Its values obey `RECORD_RULES`, in the order a record is judged
(its first broken rule is the one reported).

Three readers apply these rules: the tf.data pipeline's in-graph check
(`batch_parsing`, whole batches as TF reductions), the replay that names the bad
record of a failed pipeline (`bad_records`, through the same in-graph check) and
`prepare --check` (`check`, batches of numpy arrays). Each rule carries its own
words, so a rule changes here and nowhere else.

Two kinds of rules:
- `ValueRule`s: each value of a feature lies in [0, upper) or is the one exempt
  value, an elementwise test that works alike on numpy arrays and on TF tensors.
  Every reader enforces them (predict's in-memory arrays too,
  `kroberta.inference.inputs`): an id outside the vocabulary would make JAX read
  another embedding row, a label outside it a NaN loss.
- `LayoutRule`s: the padding is a suffix of <pad> tokens (numpy). Only `prepare
  --check` enforces them, so that the pipeline's check stays a few whole-batch
  reductions (its speed, docs/design.md, "The input pipeline").
"""

import dataclasses
from typing import Callable

from kroberta.tokens import IGNORE_LABEL

FEATURE_KIND = "int64_list"  # the `tf.train.Feature` kind of every feature
VOCABULARY = "vocabulary"  # a ValueRule's `upper`: the vocabulary size, when known


def wrong_length(count, expected) -> list:
    """The words for a feature with `count` values where `expected` are due, as parts
    (a count may be a TF string tensor): `"".join(map(str, parts))` or `tf.strings.join`."""
    return ["has ", count, f" values, expected {expected}"]


@dataclasses.dataclass(frozen=True)
class ValueRule:
    """Every value of `feature` lies in [0, upper), or equals `exempt`.

    `upper` is an int or `VOCABULARY`: the vocabulary size, and without one (None) only
    negative values break the rule. `found(position, upper)` words a broken rule for
    `prepare --check` (the value and its position are known); `holds(upper)` for the
    pipeline, where "{}" (if present) stands for the largest offending |value| of the
    record; `upper` is `upper_bound(vocabulary_size)`.
    """

    feature: str
    upper: int | str
    exempt: int | None
    found: Callable[[int, int | None], str]
    holds: Callable[[int | None], str]

    def upper_bound(self, vocabulary_size=None):
        """The exclusive upper bound of the values (None: unbounded)."""
        return vocabulary_size if self.upper == VOCABULARY else self.upper

    def bad(self, values, vocabulary_size=None):
        """True where a value (numpy array or TF tensor) breaks the rule."""
        upper = self.upper_bound(vocabulary_size)
        outside = (values < 0) if upper is None else (values < 0) | (values >= upper)
        return outside if self.exempt is None else (values != self.exempt) & outside


@dataclasses.dataclass(frozen=True)
class LayoutRule:
    """A rule over a record's whole (n, L) `input_ids` and `attention_mask` (numpy).

    `where(ids, mask, pad_id)` -> ((n, K) bool: where it breaks, (n, K) the values to
    report there); `found(position, pad_id)` words it (`position` indexes K).
    """

    feature: str
    where: Callable
    found: Callable[[int, int], str]


def _vocabulary_words(upper, unknown, known):
    return unknown if upper is None else known.format(upper)


INPUT_IDS = ValueRule(
    "input_ids",
    VOCABULARY,
    None,
    found=lambda p, upper: (
        f"id {_vocabulary_words(upper, 'negative', 'outside [0, {})')} at position {p}"
    ),
    holds=lambda upper: f"holds id {{}} outside the vocabulary [0, {upper})",
)
ATTENTION_MASK = ValueRule(
    "attention_mask",
    2,
    None,
    found=lambda p, upper: f"not 0/1 at position {p}",
    holds=lambda upper: "holds values other than 0 and 1",
)
LABELS = ValueRule(
    "labels",
    VOCABULARY,
    IGNORE_LABEL,
    found=lambda p, upper: (
        f"neither {IGNORE_LABEL} nor "
        f"{_vocabulary_words(upper, 'a non-negative id', 'an id in [0, {})')} "
        f"at position {p}"
    ),
    holds=lambda upper: f"holds a value that is neither {IGNORE_LABEL} nor a vocabulary id",
)

RECORD_RULES = (
    INPUT_IDS,
    ATTENTION_MASK,
    # Padding is a suffix: once 0, never 1 again.
    LayoutRule(
        "attention_mask",
        lambda ids, mask, pad: ((mask[:, 1:] > mask[:, :-1]), mask[:, 1:]),
        found=lambda p, pad: f"1 after padding at position {p + 1}",
    ),
    LayoutRule(
        "attention_mask",
        lambda ids, mask, pad: ((mask == 0).all(axis=1, keepdims=True), mask[:, :1]),
        found=lambda p, pad: "all zeros: no real tokens",
    ),
    LayoutRule(
        "input_ids",
        lambda ids, mask, pad: ((mask == 0) & (ids != pad), ids),
        found=lambda p, pad: f"not the pad id {pad} where attention_mask is 0 (position {p})",
    ),
    LABELS,
)
VALUE_RULES = tuple(rule for rule in RECORD_RULES if isinstance(rule, ValueRule))

# The value rules one feature at a time, for arrays held in memory.
bad_id = INPUT_IDS.bad  # (ids, vocabulary_size=None): outside [0, V) (negatives when V is None)
bad_attention = ATTENTION_MASK.bad  # (mask): values other than 0 and 1
bad_label = LABELS.bad  # (labels, vocabulary_size=None): neither IGNORE_LABEL nor an id

"""prepare's arguments, checked, as its steps read them (`kroberta.text.build`)."""

import dataclasses
import os
from typing import Any


@dataclasses.dataclass(frozen=True)
class PrepareJob:
    """`prepare()`'s arguments (but `overwrite`) once checked; see `prepare` for each.
    `workers` is resolved (never None) and `given_tokenizer` is the tokenizer to reuse,
    loaded (None: one is trained)."""

    inputs: Any
    out_dir: str
    vocab_size: int
    seq_len: int
    validation_fraction: float
    shards: int | None
    labels: str | None
    mask_rate: float
    tokenizer: Any
    seed: int
    strict: bool
    progress: bool
    text_field: str
    split: str
    line_by_line: bool
    workers: int
    tokenizer_sample_bytes: int
    chunk_bytes: int | None
    given_tokenizer: Any = None

    @classmethod
    def of(cls, arguments: dict, workers: int, given_tokenizer) -> "PrepareJob":
        """The job of `prepare`'s `arguments` (its keywords but `overwrite`)."""
        return cls(**{**arguments, "out_dir": os.fspath(arguments["out_dir"]),
                      "line_by_line": bool(arguments["line_by_line"]), "workers": workers,
                      "given_tokenizer": given_tokenizer})

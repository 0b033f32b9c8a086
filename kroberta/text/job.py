"""prepare's state: its arguments checked (`PrepareJob`), what its workers are given
(`WorkerJob`) and what a chunk's work gives back (`ChunkResult`)."""

import dataclasses
import os
from typing import Any

SPLITS = ("train", "validation")


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
        return cls(
            **{
                **arguments,
                "out_dir": os.fspath(arguments["out_dir"]),
                "line_by_line": bool(arguments["line_by_line"]),
                "workers": workers,
                "given_tokenizer": given_tokenizer,
            }
        )


@dataclasses.dataclass(frozen=True)
class WorkerJob:
    """What every worker needs to prepare any chunk (picklable: spawned workers get it)."""

    tokenizer_json: str  # the tokenizer, `Tokenizer.to_str()`
    seq_len: int
    line_by_line: bool
    labels: str | None  # "static" or None
    mask_rate: float
    seed: int
    specials: dict[str, int]  # special token name -> id
    special_ids: list[int]  # every special token's id, never masked
    vocabulary_size: int
    validation_fraction: float
    work_dir: Any  # the `kroberta.text.work_dir.WorkDir` (which imports this module)


@dataclasses.dataclass(frozen=True)
class SplitCount:
    sequences: int
    tokens: int


@dataclasses.dataclass(frozen=True)
class ChunkResult:
    """A finished chunk's counts, saved as its result file (JSON, `to_json`)."""

    index: int
    train: SplitCount
    validation: SplitCount
    documents: int
    lines: dict[str, int]  # path -> lines read of it (text files)
    long_documents: dict[str, tuple]  # path -> (lines, first line) of its longest document
    last_tokens: dict[str, int]  # split -> tokens of its last record, for `assembly`

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, entries: dict) -> "ChunkResult":
        return cls(**{**entries, **{split: SplitCount(**entries[split]) for split in SPLITS}})

"""What lets a stopped prepare go on: its plan, kept in the work directory (`kroberta.text.work_dir`).

The plan records the arguments and the inputs (path, size, modification time) it was
made for, the chunks, the scan's findings and the tokenizer (saved next to it): a run
with the same arguments on the same files takes it up and redoes only the chunks
without a result (`kroberta.text.workers`); other arguments or changed files are
refused until `--overwrite` starts over.
"""

import dataclasses
import glob
import hashlib
import os

from kroberta import storage
from kroberta.text import locations
from kroberta.text.chunks import Chunk
from kroberta.text.textfiles import Source

# prepare's arguments that decide its output (`workers` and `progress` do not).
DECIDING = (
    "vocab_size",
    "seq_len",
    "validation_fraction",
    "shards",
    "labels",
    "mask_rate",
    "seed",
    "strict",
    "text_field",
    "split",
    "line_by_line",
    "chunk_bytes",
    "tokenizer_sample_bytes",
)


def _stamp(path):
    """(size, modification time in ns) of a local file, (size, None) of a URL's object."""
    # An object's modification time is no one field across fsspec filesystems (gcsfs'
    # "updated", s3fs' "LastModified", memory://'s "created"): a URL's size alone is compared.
    if storage.is_url(path):
        return locations.size(path), None
    if os.path.isdir(path):  # a `datasets` directory: its files' stamps
        stat = [
            os.stat(f)
            for f in sorted(glob.glob(os.path.join(path, "**"), recursive=True))
            if os.path.isfile(f)
        ]
        return sum(s.st_size for s in stat), max((s.st_mtime_ns for s in stat), default=None)
    stat = os.stat(path)
    return stat.st_size, stat.st_mtime_ns


def resume_key(job, files) -> dict:
    """What a plan must have been made for to be taken up: the deciding arguments, the
    tokenizer given (its path, or a hash of a `tokenizers.Tokenizer`'s JSON) and each
    input's path, size and modification time."""
    tokenizer = job.tokenizer
    if tokenizer is not None and not isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = "sha256:" + hashlib.sha256(tokenizer.to_str().encode()).hexdigest()
    elif tokenizer is not None:
        tokenizer = storage.absolute(os.fspath(tokenizer))
    return {
        "arguments": {name: getattr(job, name) for name in DECIDING},
        "tokenizer": tokenizer,
        "inputs": [[storage.absolute(f), *_stamp(f)] for f in files],
    }


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the first run decided, saved for the runs that take it up (plan.json)."""

    key: dict  # `resume_key`: what the plan was made for
    chunks: list[Chunk]
    skipped: list[dict]  # the text files skipped: {"path", "problem", "offset"}
    total_bytes: int  # of the inputs used
    files: list[list]  # [path, format (None: text)] of each input used
    shortfall: str | None  # the tokenizer's vocabulary shortfall note
    specials: dict[str, int]  # special token name -> id
    tokenizer_sample_bytes: int | None  # the sample the tokenizer was trained on (None: given)
    tokenizer_s: float  # seconds to the tokenizer, for the manifest's timing

    def to_json(self) -> dict:
        chunks = [
            [c.index, [dataclasses.asdict(s) for s in c.sources], list(c.sizes)]
            for c in self.chunks
        ]
        return {**vars(self), "chunks": chunks}

    @classmethod
    def from_json(cls, entries: dict) -> "Plan":
        chunks = [
            Chunk(index, tuple(Source(**s) for s in sources), tuple(sizes))
            for index, sources, sizes in entries["chunks"]
        ]
        return cls(**{**entries, "chunks": chunks})

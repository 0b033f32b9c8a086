"""`out_dir/.prepare/`: a prepare's work directory, whose layout only `WorkDir` knows.

It holds the plan (plan.json, written last of the plan's files), the tokenizer, and per
chunk its parts (`chunk-000001.train.tfrecord`, `chunk-000001.validation.tfrecord`) and
its result (`chunk-000001.json`, written last: the chunk is done when it exists). Files
are written under temporary names (`.tmp-*`) and renamed. The directory goes once the
manifest is written; a prepare stopped before keeps it, and the same command resumes.
"""

import contextlib
import dataclasses
import glob
import json
import os
import shutil

from kroberta import storage
from kroberta.atomic import atomic_write
from kroberta.text.job import SPLITS, ChunkResult
from kroberta.text.resume import Plan
from kroberta.text.tokenizer import TOKENIZER_FILE

NAME = ".prepare"


@dataclasses.dataclass(frozen=True)
class WorkDir:
    """The work directory of a prepare into `out_dir` (picklable: workers get it)."""

    path: str

    @classmethod
    def of(cls, out_dir) -> "WorkDir":
        return cls(os.path.join(os.fspath(out_dir), NAME))

    def __str__(self):
        return self.path

    @property
    def plan_path(self) -> str:
        return os.path.join(self.path, "plan.json")

    @property
    def tokenizer_path(self) -> str:
        return os.path.join(self.path, TOKENIZER_FILE)

    def part_path(self, index, split) -> str:
        """A chunk's records of one split."""
        return os.path.join(self.path, f"chunk-{index:06d}.{split}.tfrecord")

    def result_path(self, index) -> str:
        """A chunk's result (counts), written last: the chunk is done when it exists."""
        return os.path.join(self.path, f"chunk-{index:06d}.json")

    def writing(self, path, what):
        """`kroberta.storage.writing` for prepare's files: a write that fails (a full disk,
        a read-only directory) is one StorageError naming the `what` at `path` and the
        free space, which says that the same command resumes from the finished chunks."""
        return storage.writing(
            path,
            what,
            then="free space there (or make it writable) and run the same "
            f"command again: it resumes from the finished chunks in {self.path}",
        )

    def create(self):
        """An empty work directory, in place of any there."""
        self.remove()
        with storage.writing(self.path, "work directory"):
            os.makedirs(self.path)

    def remove(self):
        shutil.rmtree(self.path, ignore_errors=True)

    def has_plan(self) -> bool:
        return os.path.exists(self.plan_path)

    def load_plan(self) -> Plan | None:
        return _read_json(self.plan_path, Plan)

    def save_plan(self, plan: Plan):
        """Written last of the plan's files: a work directory without one starts over."""
        with (
            storage.writing(self.plan_path, "plan"),
            atomic_write(self.plan_path, encoding="utf-8") as f,
        ):
            json.dump(plan.to_json(), f)

    def load_result(self, index) -> ChunkResult | None:
        """The result of a finished chunk, or None."""
        return _read_json(self.result_path(index), ChunkResult)

    def save_result(self, result: ChunkResult):
        """A chunk's result, once its parts are written: the chunk is done."""
        path = self.result_path(result.index)
        with self.writing(path, "chunk's result"), atomic_write(path, encoding="utf-8") as f:
            json.dump(result.to_json(), f)

    def finished(self, chunks) -> dict:
        """Chunk index -> result of the chunks done: a result file, and the parts it
        counts (a part already moved into a shard by an assembly that was stopped is redone)."""
        done = {}
        for chunk in chunks:
            result = self.load_result(chunk.index)
            if result is not None and all(
                os.path.exists(self.part_path(chunk.index, split))
                for split in SPLITS
                if getattr(result, split).sequences
            ):
                done[chunk.index] = result
        return done

    def remove_stray(self):
        """Temporary files of processes that were stopped mid-write."""
        for path in glob.glob(os.path.join(self.path, ".tmp-*")):
            with contextlib.suppress(OSError):
                os.remove(path)


def _read_json(path: str, record):
    """`record.from_json` of the JSON file at `path`; None when it is missing, damaged, or
    an older version's (TypeError, KeyError: other fields): the work it records is redone."""
    try:
        with open(path, encoding="utf-8") as f:
            return record.from_json(json.load(f))
    except (OSError, ValueError, TypeError, KeyError):
        return None

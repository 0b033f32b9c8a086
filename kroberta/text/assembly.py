"""The chunks' parts joined into a prepared directory's shards, in chunk order.

Consecutive chunks' parts of a split become one shard (a TFRecord file is its records'
frames end to end, so joining is a byte copy, or a rename for a single part): the
shards hold the records in corpus order, each a stretch of it, as many as asked and
no more than there are parts.
"""

import math
import os
from typing import NamedTuple

from kroberta.atomic import atomic_write
from kroberta.data.tfrecord_files import concatenate, record_offsets
from kroberta.text.job import SPLITS, SplitCount


class MovedRecord(NamedTuple):
    """The one record moved to the other split (`_moved`)."""

    split: str  # the split it leaves
    chunk: int  # the chunk whose last record of `split` it is
    frame: bytes  # the record's whole frame, as its part holds it
    offset: int  # where that frame starts in the part
    tokens: int


def groups(counts: list[int], shards: int) -> list[list[int]]:
    """Positions of `counts` (records per part, all > 0) in at most `shards` consecutive
    groups of about equal records."""
    shards = max(1, min(shards, len(counts)))
    total = sum(counts)
    out, seen = [[] for _ in range(shards)], 0
    for position, count in enumerate(counts):
        # The group where the part's middle record falls: never behind the previous part's.
        out[min(shards - 1, math.floor((seen + count / 2) * shards / total))].append(position)
        seen += count
    return [g for g in out if g]


def _moved(results, fraction, work_dir) -> MovedRecord | None:
    """The one record to move to the other split so that neither is empty where it can
    be (prepare's rule before its records were made in chunks): the corpus's last train
    record when validation got none (and `fraction` > 0), its last validation record
    when train got none. None when nothing moves."""
    order = sorted(results)
    count = {split: sum(getattr(results[i], split).sequences for i in order) for split in SPLITS}
    if fraction > 0 and count["validation"] == 0 and count["train"] > 1:
        source = "train"
    elif count["train"] == 0 and count["validation"] > 0:
        source = "validation"
    else:
        return None
    last = max(i for i in order if getattr(results[i], source).sequences)
    path = work_dir.part_path(last, source)
    offset = record_offsets(path)[-2]
    with open(path, "rb") as f:
        f.seek(offset)
        return MovedRecord(source, last, f.read(), offset, results[last].last_tokens[source])


def assemble_splits(out_dir, work_dir, results, shards, fraction, written):
    """Writes both splits' shards from the chunks' parts (`results`: chunk index -> its
    result); `shards`: (train, validation) files at most; `written` hears each file.
    Returns the manifest entries (train, validation)."""
    moved = _moved(results, fraction, work_dir)
    infos = []
    for split, count in zip(SPLITS, shards):
        entries = {i: getattr(results[i], split) for i in results}
        trim = None
        if moved is not None and moved.split == split:
            left = entries[moved.chunk]
            entries[moved.chunk] = SplitCount(left.sequences - 1, left.tokens - moved.tokens)
            trim = (moved.chunk, moved.offset)
        order = [i for i in sorted(entries) if entries[i].sequences]
        names = []
        if order:
            grouped = groups([entries[i].sequences for i in order], count)
            for number, members in enumerate(grouped):
                names.append(f"{split}-{number:05d}-of-{len(grouped):05d}.tfrecord")
                target = os.path.join(out_dir, names[-1])
                written.append(target)
                parts = [work_dir.part_path(order[m], split) for m in members]
                limit = trim[1] if trim is not None and order[members[-1]] == trim[0] else None
                with work_dir.writing(target, "shard"):
                    concatenate(parts, target, last_part_bytes=limit)
        elif moved is not None:  # the split's one record, moved here
            names.append(f"{split}-00000-of-00001.tfrecord")
            target = os.path.join(out_dir, names[-1])
            written.append(target)
            with work_dir.writing(target, "shard"), atomic_write(target, "wb") as f:
                f.write(moved.frame)
            got = entries[moved.chunk]
            entries[moved.chunk] = SplitCount(got.sequences + 1, got.tokens + moved.tokens)
        infos.append(
            {
                "files": names,
                "sequences": sum(e.sequences for e in entries.values()),
                "tokens": sum(e.tokens for e in entries.values()),
            }
        )
    return tuple(infos)

"""A corpus cut into chunks: the units prepare's workers tokenize, pack and write.

A plain text file larger than the chunk size is cut into byte ranges, each cut just
after a blank line near the target offset (documents stay whole), or, where no blank
line comes within `SEARCH_BYTES`, at the next line start; a gzipped text file and a
record file (JSON lines, CSV, Parquet, `datasets`) is read whole. Consecutive files
smaller than a chunk share one (a chunk is packed on its own, its last sequence
padded: a corpus of many small files must not pad each). The cuts depend only
on the files and the chunk size, never on the number of workers: the same corpus
gives the same chunks, so the same records in the same order, for any `--workers`.
"""

import dataclasses
import re

from kroberta.text import locations
from kroberta.text.textfiles import Source

CHUNK_BYTES = 64 << 20  # of input text per chunk: ~a minute of one worker, ~50 MB of records
SEARCH_BYTES = 1 << 20  # how far past a target offset a blank line is looked for
MAX_LINE_BYTES = 64 << 20  # a "line" longer than this (a binary file, skipped later) is not cut
_BLANK_LINE = re.compile(rb"\n[ \t\r\f\v]*\n")


@dataclasses.dataclass(frozen=True)
class Chunk:
    """The `index`-th chunk (from 0, in corpus order): `sources` (files, or byte ranges
    of one), read one after another, holding `sizes` bytes of input each."""

    index: int
    sources: tuple
    sizes: tuple

    @property
    def size(self) -> int:
        return sum(self.sizes)


def cut_points(path: str, size: int, chunk_bytes: int) -> list[int]:
    """The byte offsets (0 < offset < size, increasing) where a plain text file of `size`
    bytes is cut into chunks of about `chunk_bytes`, each at a line start."""
    cuts = []
    with locations.open_input(path) as f:
        target = chunk_bytes
        while target < size:
            cut = _cut_after(f, target, size)
            if cut is None:
                break
            cuts.append(cut)
            target = cut + chunk_bytes
    return cuts


def _cut_after(f, target: int, size: int) -> int | None:
    """The first line start after a blank line at or after `target` (within
    SEARCH_BYTES), else the first line start after `target`; None when none is left
    before the end of the file."""
    # From one byte before: a blank line starting right at `target` is found too.
    f.seek(target - 1)
    window = f.read(SEARCH_BYTES)
    found = _BLANK_LINE.search(window)
    if found is not None:
        cut = target - 1 + found.end()
        return cut if cut < size else None
    newline = window.find(b"\n")
    while newline < 0 and len(window) < MAX_LINE_BYTES:  # a line longer than the window: read on
        more = f.read(SEARCH_BYTES)
        if not more:
            return None
        newline = more.find(b"\n")
        if newline >= 0:
            newline += len(window)
        window += more
    if newline < 0:
        return None
    cut = target + newline
    return cut if cut < size else None


def plan_chunks(sources: list[Source], sizes: list[int], chunk_bytes: int = CHUNK_BYTES) -> list[Chunk]:
    """The chunks of the `sources` (whose sizes in bytes are `sizes`), in corpus order:
    pieces (whole files, ranges of large ones) gathered until a chunk holds `chunk_bytes`."""
    pieces = []
    for source, size in zip(sources, sizes):
        splittable = source.format is None and not source.path.lower().endswith(".gz")
        cuts = cut_points(source.path, size, chunk_bytes) if splittable and size > chunk_bytes else []
        if not cuts:
            pieces.append((source, size))
            continue
        bounds = [0, *cuts, size]
        pieces += [(dataclasses.replace(source, start=start, end=end), end - start)
                   for start, end in zip(bounds, bounds[1:])]
    chunks, gathered = [], []
    for piece in pieces:
        gathered.append(piece)
        if sum(size for _, size in gathered) >= chunk_bytes:
            chunks.append(Chunk(len(chunks), *map(tuple, zip(*gathered))))
            gathered = []
    if gathered:
        chunks.append(Chunk(len(chunks), *map(tuple, zip(*gathered))))
    return chunks

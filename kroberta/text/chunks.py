"""A corpus cut into chunks: the units prepare's workers tokenize, pack and write.

A file larger than the chunk size is cut into byte ranges, each starting a record:
- plain text just after a blank line near the target offset (documents stay whole),
  or, where no blank line comes within `SEARCH_BYTES`, at the next line start;
- JSON lines and TSV (one record per line: a TSV is read without quoting) at the
  first line start at or after the target offset;
- CSV at the first record start at or after it: RFC 4180 lets a quoted field hold
  line breaks, and whether a line starts a record depends on every quote before it
  (a quote inside an unquoted field is a plain character), so the file is read once
  with the reader's own parser (`csv`) to find them: a serial pass in the main
  process, cheaper than reading the records, that cuts no record in two.
A gzipped file cannot be cut (a gzip stream has no seek points: reading from the
middle means decompressing everything before it), nor can a JSON array, Parquet or
a `datasets` directory: each is one piece, read whole. Consecutive files
smaller than a chunk share one (a chunk is packed on its own, its last sequence
padded: a corpus of many small files must not pad each). The cuts depend only
on the files and the chunk size, never on the number of workers: the same corpus
gives the same chunks, so the same records in the same order, for any `--workers`.
"""

import csv
import dataclasses
import re
import sys

from kroberta.text import locations
from kroberta.text.recordfiles import check_record_count, first_byte
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

    def describe(self) -> str:
        """`chunk 3 (corpus/a.txt bytes 2400-3600)`: the chunk and the input it holds."""
        pieces = [
            source.path
            if source.start == 0 and source.end is None
            else f"{source.path} bytes {source.start}-{source.start + size}"
            for source, size in zip(self.sources, self.sizes)
        ]
        more = f" and {len(pieces) - 2} more file(s)" if len(pieces) > 2 else ""
        return f"chunk {self.index} ({', '.join(pieces[:2])}{more})"


def cut_points(path: str, size: int, chunk_bytes: int, blank_lines: bool = True) -> list[int]:
    """The byte offsets (0 < offset < size, increasing) where a file of `size` bytes of
    lines (plain text; JSON lines or TSV: `blank_lines` False) is cut into chunks of
    about `chunk_bytes`, each at a line start (after a blank line where one is near)."""
    cuts = []
    with locations.open_input(path) as f:
        target = chunk_bytes
        while target < size:
            cut = _cut_after(f, target, size, blank_lines)
            if cut is None:
                break
            cuts.append(cut)
            target = cut + chunk_bytes
    return cuts


def _cut_after(f, target: int, size: int, blank_lines: bool) -> int | None:
    """The first line start after a blank line at or after `target` (within
    SEARCH_BYTES, when `blank_lines`), else the first line start at or after `target`;
    None when none is left before the end of the file."""
    # From one byte before: a blank line (or a line) starting right at `target` is found too.
    f.seek(target - 1)
    window = f.read(SEARCH_BYTES)
    found = _BLANK_LINE.search(window) if blank_lines else None
    if found is not None:
        cut = target - 1 + found.end()
        return cut if cut < size else None
    newline = window.find(b"\n")
    while newline < 0 and len(window) < MAX_LINE_BYTES:  # a line longer than the window: read on
        more = f.read(SEARCH_BYTES)
        if not more:
            return None
        window += more
        newline = window.find(b"\n", len(window) - len(more))
    if newline < 0:
        return None
    cut = target + newline
    return cut if cut < size else None


def csv_cut_points(path: str, size: int, chunk_bytes: int) -> list[int]:
    """The byte offsets (0 < offset < size, increasing) where a CSV file is cut into
    chunks of about `chunk_bytes`, each at the start of a record as `csv` reads it
    (RFC 4180: a quoted field may span lines). Reads the whole file; a file the parser
    stops on is not cut after that point (its reader names the error). A file it cuts
    gets the warning a whole file's reader gives when its records are fewer than its
    data lines (its pieces' readers do not: the warning comes once per file)."""
    cuts, offset, target = [], 0, chunk_bytes
    data_lines, records, spanning = 0, 0, None

    def lines(f):
        nonlocal offset, data_lines
        for number, line in enumerate(f):
            offset += len(line)
            if number == 0:  # a byte-order mark, dropped when read
                line = line.removeprefix(b"\xef\xbb\xbf")
            data_lines += bool(line.rstrip(b"\r\n"))
            # Quotes, commas and line ends are ASCII, which no byte of a multi-byte UTF-8
            # character is: latin-1 keeps the structure and never fails.
            yield line.decode("latin-1")

    csv.field_size_limit(sys.maxsize)  # as `recordfiles` reads it: a field of any length
    with locations.open_input(path) as f:
        rows = csv.reader(lines(f), quoting=csv.QUOTE_MINIMAL)
        try:
            row_start = 0
            for row in rows:
                # The reader asks for a line only while its record is open: once a row
                # is out, `offset` is the end of that record.
                if offset >= target and offset < size:
                    cuts.append(offset)
                    target = offset + chunk_bytes
                if row and records == 0:  # the header
                    header_lines = data_lines
                if row:
                    records += 1
                    if spanning is None and rows.line_num - row_start > 1:
                        spanning = f"line {row_start + 1}"
                row_start = rows.line_num
        except csv.Error:
            return cuts
    if cuts:  # a file left whole is counted by its reader
        check_record_count(path, records - 1, data_lines - header_lines, spanning)
    return cuts


def file_cut_points(source: Source, size: int, chunk_bytes: int) -> list[int]:
    """Where `source` (whole, `size` bytes) is cut into pieces of about `chunk_bytes`:
    none for a file no larger, gzipped, or in a format without record starts to find."""
    if size <= chunk_bytes or source.path.lower().endswith(".gz"):
        return []
    if source.format is None:
        return cut_points(source.path, size, chunk_bytes)
    if source.format == "tsv" or (source.format == "jsonl" and first_byte(source.path) != b"["):
        return cut_points(source.path, size, chunk_bytes, blank_lines=False)
    if source.format == "csv":
        return csv_cut_points(source.path, size, chunk_bytes)
    return []  # a JSON array, Parquet, `datasets`


def plan_chunks(
    sources: list[Source], sizes: list[int], chunk_bytes: int = CHUNK_BYTES
) -> list[Chunk]:
    """The chunks of the `sources` (whose sizes in bytes are `sizes`), in corpus order:
    pieces (whole files, ranges of large ones) gathered until a chunk holds `chunk_bytes`."""
    pieces = []
    for source, size in zip(sources, sizes):
        cuts = file_cut_points(source, size, chunk_bytes)
        if not cuts:
            pieces.append((source, size))
            continue
        bounds = [0, *cuts, size]
        pieces += [
            (dataclasses.replace(source, start=start, end=end), end - start)
            for start, end in zip(bounds, bounds[1:])
        ]
    chunks, gathered = [], []
    for piece in pieces:
        gathered.append(piece)
        if sum(size for _, size in gathered) >= chunk_bytes:
            chunks.append(Chunk(len(chunks), *map(tuple, zip(*gathered))))
            gathered = []
    if gathered:
        chunks.append(Chunk(len(chunks), *map(tuple, zip(*gathered))))
    return chunks

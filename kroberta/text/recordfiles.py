"""Files of records: JSON lines, CSV/TSV, Parquet, `datasets` (prepare's corpora, one
document per record, and fine-tuning's labelled sets).

Every reader streams, so memory stays flat however large the file is: JSON lines
and CSV line by line (gzipped or not), a JSON array (a `.json` file holding
`[{...}, ...]`) one object at a time, Parquet and `datasets` one Arrow batch at a
time (`kroberta.text.arrowfiles`). Each yields the records in file order with where
they are ("line 7", "record 3") for messages, and reports progress through
`on_bytes` in bytes of the file (compressed bytes for .gz).
"""

import csv
import gzip
import io
import json
import logging
import os
import re
import sys
import zlib

from kroberta.errors import InputError
from kroberta.text import arrowfiles, locations
from kroberta.text.arrowfiles import ARROW_FORMATS, DATASETS_FORMAT
from kroberta.text.columns import TEXT_FIELD_OPTION, check_columns
from kroberta.text.progress import ByteProgress

FORMATS = {  # name suffix -> format (the longest matching suffix wins)
    ".jsonl": "jsonl",
    ".jsonl.gz": "jsonl",
    ".json": "jsonl",
    ".json.gz": "jsonl",
    ".ndjson": "jsonl",
    ".ndjson.gz": "jsonl",
    ".csv": "csv",
    ".csv.gz": "csv",
    ".tsv": "tsv",
    ".tsv.gz": "tsv",
    ".parquet": "parquet",
}
# Files `save_to_disk` writes: a Dataset's state, or a DatasetDict's split list.
DATASET_FILES = ("state.json", "dataset_info.json")
DATASET_DICT_FILE = "dataset_dict.json"
_PROGRESS_EVERY = 1 << 20  # characters per read of a JSON array
_BOM = b"\xef\xbb\xbf"  # a UTF-8 byte-order mark, which some tools write first
_SPACE = re.compile(r"\s*")  # what str.isspace calls space
# csv's quoting per delimited format. TSV is read as GLUE's processors (Hugging Face's
# `transformers.data.processors`) read it: split at tabs, a quote is a character like
# any other, so one sentence that begins with `"` cannot swallow the rows after it.
# CSV keeps RFC 4180's quoting, which is how a field holds commas or line breaks.
_QUOTING = {"csv": csv.QUOTE_MINIMAL, "tsv": csv.QUOTE_NONE}
_DELIMITER = {"csv": ",", "tsv": "\t"}

logger = logging.getLogger(__name__)


def is_dataset_dir(path: str) -> bool:
    """A directory written by `datasets`' `save_to_disk` (a Dataset or a DatasetDict)."""
    return os.path.isdir(path) and (
        os.path.isfile(os.path.join(path, DATASET_DICT_FILE))
        or all(os.path.isfile(os.path.join(path, f)) for f in DATASET_FILES)
    )


def record_format(path: str) -> str | None:
    """The record format of `path`, or None for a text file."""
    if is_dataset_dir(path):
        return DATASETS_FORMAT
    name = os.path.basename(path).lower()
    matches = [suffix for suffix in FORMATS if name.endswith(suffix)]
    return FORMATS[max(matches, key=len)] if matches else None


# ---------------------------------------------------------------- JSON lines


def first_byte(path):
    """The first non-whitespace byte of a (possibly gzipped) file, b"" when it has none."""
    raw, stream = locations.open_stream(path)
    with raw, stream:
        start = True
        while block := stream.read(4096):
            if start:
                block, start = block.removeprefix(_BOM), False
            if stripped := block.lstrip():
                return stripped[:1]
    return b""


def _record_text(record, path, where, field):
    if not isinstance(record, dict):
        raise InputError(
            f"{path}: {where}: a JSON {type(record).__name__}, not an object with a {field!r} field"
        )
    if field not in record:
        raise InputError(
            f"{path}: {where}: no field {field!r} (fields: {', '.join(record) or 'none'}); "
            "pick one with --text-field"
        )
    value = record[field]
    if value is None or isinstance(value, str):
        return value
    raise InputError(
        f"{path}: {where}: field {field!r} holds {type(value).__name__} "
        f"{str(value)[:40]!r}, not text; pick another with --text-field"
    )


def _json_array_records(path, on_bytes):
    """Stream the objects of a top-level JSON array: at most one read block plus one
    record is held, however long the array is."""
    raw, stream = locations.open_stream(path)
    progress = ByteProgress(raw, on_bytes)
    decoder = json.JSONDecoder()
    with raw, stream:
        text = io.TextIOWrapper(stream, encoding="utf-8-sig")
        buffer, position, number, eof = "", 0, 0, False

        def more():
            nonlocal buffer, position, eof
            try:
                chunk = text.read(_PROGRESS_EVERY)
            except UnicodeDecodeError as e:
                raise InputError(f"{path}: not UTF-8 ({e.reason})") from None
            buffer, position, eof = buffer[position:] + chunk, 0, not chunk

        def next_character():
            """The next character that is not space ("" at the end), reading on as needed."""
            nonlocal position
            while (position := _SPACE.match(buffer, position).end()) == len(buffer) and not eof:
                more()
            return buffer[position : position + 1]

        next_character()
        position += 1  # the "[" (checked by iter_records)
        expect_item = True
        while (character := next_character()) != "]":
            if not character:
                raise InputError(f"{path}: the JSON array ends early, after {number} record(s)")
            if not expect_item:
                if character != ",":
                    raise InputError(f"{path}: record {number}: expected ',' or ']' after it")
                position, expect_item = position + 1, True
                continue
            try:
                record, end = decoder.raw_decode(buffer, position)
            except json.JSONDecodeError as e:
                if eof:
                    raise InputError(
                        f"{path}: record {number + 1}: not valid JSON: {e.msg}"
                    ) from None
                more()  # the record may continue in the next block
                continue
            if end == len(buffer) and not eof:
                more()  # a number or literal cut at the block's end: decode it whole
                continue
            number += 1
            position, expect_item = end, False
            yield f"record {number}", record
            progress.poll()
        progress.finish(locations.size(path))


def _line(number, start):
    """Where a line is, for messages: in a piece that starts inside the file, its number
    counts from the piece's first byte."""
    return f"line {number}" if not start else f"line {number} from byte {start}"


def _jsonl_records(path, on_bytes, start=0, end=None):
    raw, stream = locations.open_range(path, start, end)
    progress = ByteProgress(raw, on_bytes, start)
    with raw, stream:
        for number, line in enumerate(stream, start=1):
            if number == 1 and not start:
                line = line.removeprefix(_BOM)
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except UnicodeDecodeError as e:
                raise InputError(
                    f"{path}: {_line(number, start)}: not UTF-8 ({e.reason})"
                ) from None
            except json.JSONDecodeError as e:
                hint = ""
                if number == 1 and not start:  # most often one object over many lines
                    hint = (
                        "; JSON lines hold one whole object per line (or give a JSON array, "
                        "[{...}, ...])"
                    )
                raise InputError(
                    f"{path}: {_line(number, start)}: not a JSON object: {e.msg}{hint}"
                ) from None
            yield _line(number, start), record
            progress.poll()
        progress.finish(locations.size(path) if end is None else end)


# ---------------------------------------------------------------- CSV / TSV


class _DataLines:
    """Counts the lines of a delimited file that hold something (the csv reader yields no
    row for an empty line), to compare with the records read."""

    def __init__(self):
        self.count = 0


def _csv_rows(path, stream, delimiter, quoting, data_lines: _DataLines, start=0):
    """csv rows of a binary stream, decoded line by line, so that bytes that are not
    UTF-8 are named by their line (a text wrapper decodes blocks ahead of the reader);
    `start`: the stream's first byte in the file (for messages)."""

    def lines():
        for number, line in enumerate(stream, start=1):  # bytes, with their line ends
            if number == 1 and not start and line.startswith(_BOM):
                line = line[len(_BOM) :]
            if line.rstrip(b"\r\n"):
                data_lines.count += 1
            try:
                yield line.decode("utf-8")
            except UnicodeDecodeError as e:
                raise InputError(
                    f"{path}: {_line(number, start)}: not UTF-8 ({e.reason})"
                ) from None

    csv.field_size_limit(sys.maxsize)  # a document is one field: no 128 KB cap
    return csv.reader(lines(), delimiter=delimiter, quoting=quoting)


def _csv_header(path, fmt):
    """The first row of a delimited file (its header)."""
    raw, stream = locations.open_stream(path)
    with raw, stream:
        try:
            return next(_csv_rows(path, stream, _DELIMITER[fmt], _QUOTING[fmt], _DataLines()), [])
        except csv.Error as e:
            raise InputError(f"{path}: line 1: cannot read the header: {e}") from None


def _csv_records(path, on_bytes, fmt, fields, columns, start=0, end=None):
    """Rows as dicts of column -> str; `columns` names a headerless file's columns (None:
    the first row does). A piece from byte `start` > 0 (after the header) to `end` takes
    its column names from the file's first row."""
    raw, stream = locations.open_range(path, start, end)
    progress = ByteProgress(raw, on_bytes, start)
    data_lines = _DataLines()
    with raw, stream:
        rows = _csv_rows(path, stream, _DELIMITER[fmt], _QUOTING[fmt], data_lines, start)
        if columns:
            names = list(columns)
        elif start:
            names = _csv_header(path, fmt)
        else:
            try:
                names = next(rows, [])
            except csv.Error as e:
                raise InputError(f"{path}: line 1: cannot read the header: {e}") from None
        check_columns(path, names, fields, header=not columns)
        header_lines = data_lines.count
        # A repeated name: its first column.
        first = {name: i for i, name in reversed(list(enumerate(names)))}
        records, spanning = 0, None  # spanning: the line where the first multi-line record starts
        try:
            row_start = rows.line_num
            for row in rows:
                if row:
                    if spanning is None and rows.line_num - row_start > 1:
                        spanning = _line(row_start + 1, start)
                    if fmt == "tsv" and len(row) < len(names):
                        _check_short_row(path, _line(rows.line_num, start), row, names, fields)
                    records += 1
                    yield (
                        _line(rows.line_num, start),
                        {name: row[i] for name, i in first.items() if i < len(row)},
                    )
                    progress.poll()
                row_start = rows.line_num
        except csv.Error as e:
            raise InputError(f"{path}: {_line(rows.line_num, start)}: {e}") from None
        progress.finish(locations.size(path) if end is None else end)
    # A file cut into pieces is counted whole when cut (`kroberta.text.chunks`).
    if not start and end is None:
        check_record_count(path, records, data_lines.count - header_lines, spanning)


def _check_short_row(path, line: str, row: list, names: list, fields: dict):
    """A TSV row without one of `fields`' columns: most often a text with a line break
    that a writer quoted (a TSV has no quoting here), so the message says so."""
    missing = [field for field in fields if names.index(field) >= len(row)]
    if missing:
        raise InputError(
            f"{path}: {line}: {len(row)} column(s), the header has "
            f"{len(names)}: no field {missing[0]!r}; a TSV is read as GLUE's "
            "processors read it, split at tabs with no quoting, so a record cannot "
            "span lines: write such texts with their line breaks to a .csv (RFC "
            "4180 quoting) or a .jsonl"
        )


def check_record_count(path, records: int, lines: int, spanning: str | None):
    """Warns when a delimited file's records are fewer than its data lines: in a CSV a
    quoted field may hold line breaks (RFC 4180), but a stray quote merges rows the same
    way, each merged record keeping one label; the numbers tell which it was."""
    if records == lines:
        return
    where = f" (the first from {spanning})" if spanning else ""
    logger.warning(
        f"warning: {path}: read {records:,} record(s) from {lines:,} data line(s): "
        f"a quoted field spans lines{where}; if its opening quote is a stray one, "
        "the rows up to the next quote were merged into one record"
    )


# ---------------------------------------------------------------- entry points


def _gzip_errors_named(values, path):
    """A damaged or truncated .gz surfaces as zlib's or gzip's own error: name the file."""
    try:
        yield from values
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise InputError(f"{path}: not a readable gzip file ({e})") from None


def check_source(path: str, fmt: str, field: str, split: str):
    """Fail early (before any work) when the column, the split or the extra is missing.

    Returns the source's size in bytes for the progress bar.
    """
    if fmt in ARROW_FORMATS:
        return arrowfiles.text_column_size(path, fmt, field, split)
    # The header, or the first record, has the field.
    next(iter_values(path, fmt, field, split), None)
    return locations.size(path)


def iter_records(
    path: str,
    fmt: str,
    fields,
    split: str = "train",
    on_bytes=None,
    columns=None,
    start: int = 0,
    end: int | None = None,
):
    """Yield (where, record) for each record of `path`, streaming: where is "line N" or
    "record N"; a record is a JSON value (an object when the file is well formed) or a
    dict of column -> value. A CSV/TSV header, Parquet or `datasets` without one of the
    `fields` (field -> the option that names it, for the message) is an error (the last two read only those columns); `columns` names a
    headerless CSV/TSV's columns. A TSV is split at tabs with no quote processing (as
    GLUE's processors read it); a CSV keeps RFC 4180 quoting, and a record whose quoted
    field spans lines is logged as a warning with the counts of records and data lines.
    A JSON lines or CSV/TSV file that is not gzipped may be read from byte `start` to
    byte `end` (None: its end), both at record starts (`kroberta.text.chunks`)."""
    if fmt == "jsonl" and (start or end is not None):  # a piece of a JSON lines file
        return _jsonl_records(path, on_bytes, start, end)
    if fmt == "jsonl":  # JSON lines, or a JSON array of objects (`[{...}, ...]`)

        def records():  # the first byte is read inside, where a damaged .gz is named
            reader = _json_array_records if first_byte(path) == b"[" else _jsonl_records
            yield from reader(path, on_bytes)

        return _gzip_errors_named(records(), path)
    if fmt in ("csv", "tsv"):
        return _gzip_errors_named(
            _csv_records(path, on_bytes, fmt, fields, columns, start, end), path
        )
    return arrowfiles.iter_records(path, fmt, fields, split, on_bytes)


def iter_values(path: str, fmt: str, field: str, split: str, on_bytes=None, start=0, end=None):
    """Yield the `field` value (a str or None) of each record of `path` (or of its bytes
    `start` to `end`: `iter_records`), streaming."""
    if fmt in ARROW_FORMATS:  # a column at a time: no record built per row
        yield from arrowfiles.iter_values(path, fmt, field, split, on_bytes)
        return
    for where, record in iter_records(
        path, fmt, {field: TEXT_FIELD_OPTION}, split, on_bytes, start=start, end=end
    ):
        yield _record_text(record, path, where, field)

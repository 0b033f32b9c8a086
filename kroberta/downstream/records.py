"""Labelled files as records (dicts), in the formats `prepare` reads.

Labelled sets are small beside pretraining corpora (GLUE's largest split, QQP's
364k pairs, is ~40 MB), so each file is read whole: every record is a dict of the
fields asked for, with where it came from ("line 7", "record 3") for messages.
The format is `kroberta.text.recordfiles.record_format`'s; Parquet and `datasets`
go through `kroberta.text.arrowfiles`' openers (which name a missing extra).
"""

import csv
import io
import json
import sys

from kroberta import storage
from kroberta.errors import InputError
from kroberta.text import arrowfiles, locations, recordfiles
from kroberta.text.recordfiles import DATASETS_FORMAT

_BOM = "\ufeff"


def _text(path: str) -> str:
    raw, stream = locations.open_stream(path)  # gunzipped for a name ending in .gz
    with raw, stream:
        data = stream.read()
    try:
        return data.decode("utf-8").removeprefix(_BOM)
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 ({e.reason})") from None


def _json_records(path: str):
    text = _text(path)
    if text.lstrip().startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as e:
            raise InputError(f"{path}: not a valid JSON array: {e.msg} (line {e.lineno})") from None
        yield from ((f"record {n}", r) for n, r in enumerate(records, start=1))
        return
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                yield f"line {number}", json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{path}: line {number}: not a JSON object: {e.msg}") from None


def _delimited_records(path: str, delimiter: str, columns, quoting: int):
    """Rows as dicts; `columns` names a headerless file's columns (None: the first row)."""
    csv.field_size_limit(sys.maxsize)
    rows = csv.reader(io.StringIO(_text(path), newline=""), delimiter=delimiter, quoting=quoting)
    try:
        names = list(columns) if columns else next(rows, [])
        for row in rows:
            if row:
                yield f"line {rows.line_num}", dict(zip(names, row))
    except csv.Error as e:
        raise InputError(f"{path}: line {rows.line_num}: {e}") from None


def _arrow_records(path: str, fmt: str, fields, split: str):
    if fmt == DATASETS_FORMAT:
        table = arrowfiles.load_dataset(path, split).data.table
    else:
        table = arrowfiles.parquet_file(path).read()
    for field in fields:
        recordfiles.column_index(path, table.column_names, field)
    yield from ((f"record {n}", r) for n, r in
                enumerate(table.select(list(fields)).to_pylist(), start=1))


def read_records(path: str, fields, split: str = "train", columns=None, quoting=csv.QUOTE_MINIMAL):
    """Yields (where, record) for each record of a labelled file.

    Args:
        path: a TSV/CSV, JSON lines (or JSON array), Parquet file or `datasets` directory.
        fields: the fields needed (Parquet and `datasets` read only these).
        split: the split of a `datasets` DatasetDict.
        columns: the column names of a delimited file without a header row.
        quoting: the csv module's quoting of a delimited file (GLUE's TSVs: QUOTE_NONE).

    Returns:
        An iterator of ("line N" or "record N", dict of field -> value); a record may
        lack a field (the caller names it).
    """
    if not (storage.gfile_isfile(path) or recordfiles.is_dataset_dir(path)):
        raise InputError(f"{path}: no such file")
    fmt = recordfiles.record_format(path)
    if fmt == "jsonl":
        return _json_records(path)
    if fmt in ("csv", "tsv"):
        return _delimited_records(path, "\t" if fmt == "tsv" else ",", columns, quoting)
    if fmt in ("parquet", DATASETS_FORMAT):
        return _arrow_records(path, fmt, fields, split)
    raise InputError(f"{path}: not a labelled file kroberta reads (.tsv, .csv, .jsonl, .json, "
                     ".parquet, optionally .gz, or a datasets directory)")

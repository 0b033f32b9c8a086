"""Corpora in Arrow: Parquet files and `datasets` directories (`save_to_disk`).

Both are read one Arrow batch at a time (a Parquet row group's batch; a memory-mapped
`datasets` table's batch), so memory stays flat; progress is the files' size in
proportion to the rows read. Parquet needs `pyarrow` (the `parquet` extra), a
`datasets` directory `datasets` (the `datasets` extra); without them the error says
what to install; neither loads until a file is read. `kroberta.text.recordfiles`
dispatches here.
"""

import os

from kroberta import storage
from kroberta.errors import InputError
from kroberta.text import locations
from kroberta.text.columns import TEXT_FIELD_OPTION, check_columns

DATASETS_FORMAT = "datasets"  # a directory `datasets`' save_to_disk wrote
ARROW_FORMATS = ("parquet", DATASETS_FORMAT)  # the formats read here
ARROW_BATCH_ROWS = 1024  # rows per Parquet/Arrow batch: flat memory, few Python calls


def extra_missing(what: str, extra: str, module: str) -> InputError:
    return InputError(
        f'{what} needs the {module!r} package: pip install -e ".[{extra}]" '
        f"(or pip install {module})"
    )


# ---------------------------------------------------------------- Parquet


def parquet_file(path):
    """`path` as a `pyarrow.parquet.ParquetFile` (local or a URL); InputError naming the
    file, or the extra to install, when it cannot be read."""
    try:
        # the parquet extra: loads when a Parquet file is read
        import pyarrow.parquet as pq
    except ImportError:
        raise extra_missing(f"{path}: reading Parquet", "parquet", "pyarrow") from None
    try:
        # Buffered page reads, no pre-buffering of whole row groups: the reader holds
        # about one row group's column (about half the memory of the defaults).
        source = locations.open_input(path) if storage.is_url(path) else path
        return pq.ParquetFile(source, buffer_size=1 << 20, pre_buffer=False)
    except Exception as e:  # pyarrow raises ArrowInvalid / OSError with its own text
        raise InputError(f"{path}: not a readable Parquet file: {e}") from None


# ---------------------------------------------------------------- datasets (save_to_disk)


def load_dataset(path, split):
    """The `split` of the `datasets` directory `path` (`save_to_disk`'s); InputError naming
    the directory, the missing split, or the extra to install."""
    try:
        # the datasets extra: loads when a datasets directory is read
        import datasets
    except ImportError:
        raise extra_missing(
            f"{path}: reading a datasets directory", "datasets", "datasets"
        ) from None
    try:
        loaded = datasets.load_from_disk(path)
    except Exception as e:  # FileNotFoundError or the library's own errors
        raise InputError(f"{path}: not a readable datasets directory: {e}") from None
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise InputError(
                f"{path}: a DatasetDict without a {split!r} split (splits: "
                f"{', '.join(loaded)}); pick one with --split"
            )
        return loaded[split]
    return loaded


def opened(path: str, fmt: str, fields, split: str):
    """(the Parquet file or the dataset, its Arrow schema, its size in bytes), its `fields`
    checked: fails early on a missing column, split or extra."""
    if fmt == DATASETS_FORMAT:
        source = load_dataset(path, split)
        schema = source.data.schema
        size = sum(
            os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files
        )
    else:
        source = parquet_file(path)
        schema, size = source.schema_arrow, locations.size(path)
    check_columns(path, schema.names, fields)
    return source, schema, size


def text_column_size(path: str, fmt: str, field: str, split: str) -> int:
    """The size in bytes of a Parquet file or `datasets` directory whose `field` is a text
    column; InputError otherwise."""
    _, schema, size = opened(path, fmt, {field: TEXT_FIELD_OPTION}, split)
    import pyarrow as pa  # after the openers, which name a missing extra

    kind = schema.field(field).type
    if kind not in (pa.string(), pa.large_string(), pa.string_view(), pa.null()):
        raise InputError(
            f"{path}: column {field!r} holds {kind}, not text; pick another with --text-field"
        )
    return size


def iter_records(path: str, fmt: str, fields, split: str, on_bytes=None):
    """("record N", dict of field -> value) for each row of a Parquet file or `datasets`
    directory."""
    batches = _batches(path, fmt, fields, split, on_bytes)
    records = (record for batch in batches for record in batch.to_pylist())
    for number, record in enumerate(records, start=1):
        yield f"record {number}", record


def iter_values(path: str, fmt: str, field: str, split: str, on_bytes=None):
    """The `field` value (a str or None: `text_column_size` checked the column) of each
    row, a column at a time (prepare's read: no record built per row)."""
    for batch in _batches(path, fmt, {field: TEXT_FIELD_OPTION}, split, on_bytes):
        yield from batch.column(0).to_pylist()


def _batches(path: str, fmt: str, fields, split: str, on_bytes):
    """The Arrow batches of `fields`, progress reported as each is done with."""
    source, _, size = opened(path, fmt, fields, split)
    if fmt == DATASETS_FORMAT:
        # The Arrow table is memory-mapped: batches are views of the files, not copies.
        batches = (
            source.select_columns(list(fields))
            .with_format("arrow")
            .iter(batch_size=ARROW_BATCH_ROWS)
        )
        rows = len(source)
    else:
        batches = source.iter_batches(
            batch_size=ARROW_BATCH_ROWS, columns=list(fields), use_threads=False
        )
        rows = source.metadata.num_rows
    reported, done = 0, 0
    for batch in batches:
        yield batch
        done += batch.num_rows
        if on_bytes is not None:  # progress in bytes, prorated by rows
            position = size * done // max(rows, 1)
            on_bytes(position - reported)
            reported = position

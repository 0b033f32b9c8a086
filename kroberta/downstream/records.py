"""Labelled files as records (dicts), in the formats `prepare` reads.

Fine-tuning reads its labelled sets with prepare's readers
(`kroberta.text.recordfiles.iter_records`), so each format is parsed one way.
"""

import csv

from kroberta import storage
from kroberta.errors import InputError
from kroberta.text import recordfiles


def read_records(path: str, fields, split: str = "train", columns=None, quoting=csv.QUOTE_MINIMAL):
    """Yields (where, record) for each record of a labelled file.

    Args:
        path: a TSV/CSV, JSON lines (or JSON array), Parquet file or `datasets` directory.
        fields: field -> the option that names it, for the message when a CSV/TSV header or
            Arrow schema lacks it (Parquet and `datasets` read only these fields).
        split: the split of a `datasets` DatasetDict.
        columns: the column names of a delimited file without a header row.
        quoting: the csv module's quoting of a delimited file (GLUE's TSVs: QUOTE_NONE).

    Returns:
        An iterator of ("line N" or "record N", dict of field -> value); a record may lack
        a field (the caller names it), a CSV/TSV header or Arrow schema may not.
    """
    if not (storage.gfile_isfile(path) or recordfiles.is_dataset_dir(path)):
        raise InputError(f"{path}: no such file")
    fmt = recordfiles.record_format(path)
    if fmt is None:
        raise InputError(f"{path}: not a labelled file kroberta reads (.tsv, .csv, .jsonl, .json, "
                         ".parquet, optionally .gz, or a datasets directory)")
    return recordfiles.iter_records(path, fmt, fields, split, columns=columns, quoting=quoting)

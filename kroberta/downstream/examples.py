"""A task's texts and labels, read from labelled files and checked once.

A `TaskSpec` says which field(s) hold the text (one, or a pair such as premise and
hypothesis), which holds the label, whether the task is classification or regression
and how it is scored. `read_labelled` turns one file into a `LabelledSet`: the texts,
and class ids (classification, the label set taken from the training file) or float
values (regression). Every bad record is an error naming the file, record and field.
"""

import collections
import dataclasses
import logging
import math

import numpy as np

from kroberta import storage
from kroberta.errors import InputError, NotFoundError
from kroberta.text import recordfiles
from kroberta.text.columns import TEXT_FIELD_OPTION

CLASSIFICATION, REGRESSION = "classification", "regression"
SHOWN_LABELS = 10  # class names a line lists before "... (N in all)"

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """How a labelled file is read and scored.

    Attributes:
        name: the task's name (in results and tables).
        text_fields: the field of the text, or the two fields of a text pair.
        label_field: the field of the label.
        kind: "classification" or "regression".
        metric: the metric that chooses the learning rate and goes into tables.
        labels: the class names in id order (None: the training file's, sorted).
        columns: the column names of headerless delimited files (CoLA's).
    """

    name: str
    text_fields: tuple = ("text",)
    label_field: str = "label"
    kind: str = CLASSIFICATION
    metric: str = "accuracy"
    labels: tuple | None = None
    columns: tuple | None = None

    def metrics(self, num_classes: int) -> tuple:
        """The metrics reported: the main one first."""
        if self.kind == REGRESSION:
            extra = ("pearson", "spearman")
        else:
            extra = (("accuracy", "f1", "matthews", "macro_f1") if num_classes == 2
                     else ("accuracy", "macro_f1"))
        return (self.metric,) + tuple(m for m in extra if m != self.metric)


@dataclasses.dataclass(frozen=True)
class LabelledSet:
    """One split: `texts` holds one list of strings per text field (n each); `labels`
    is (n,) int32 class ids or float32 values (zeros when `has_labels` is False: texts
    to predict)."""

    path: str
    texts: tuple
    labels: np.ndarray
    has_labels: bool = True

    def __len__(self) -> int:
        return len(self.labels)


def _sort_key(name: str):
    """Numbers in numeric order ("2" before "10"), then the rest as text."""
    try:
        return (0, float(name), "")
    except ValueError:
        return (1, 0.0, name)


def label_name(value) -> str:
    """A label as a class name: 1, 1.0 and "1" are one class."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value).strip()


def _listed(names) -> str:
    more = f", ... ({len(names)} in all)" if len(names) > SHOWN_LABELS else ""
    return ", ".join(names[:SHOWN_LABELS]) + more


def _describe_classes(path: str, spec: TaskSpec, names: list, label_names: tuple):
    """Logs the classes of a training file with their counts; warns of scores read as
    classes (--kind left at classification) and of one-example classes (a mistyped
    label, most often)."""
    counts = collections.Counter(names)
    logger.info("%s: %d examples of %d classes: %s", path, len(names), len(label_names),
                _listed([f"{name} ({counts[name]})" for name in label_names]))
    fractional = [name for name in label_names
                  if _sort_key(name)[0] == 0 and not float(name).is_integer()]
    if fractional:
        logger.warning("%s: field %r holds numbers such as %s, read as %d classes; for a "
                       "score, fine-tune with --kind regression (kind=\"regression\")", path,
                       spec.label_field, ", ".join(fractional[:3]), len(label_names))
    single = [name for name in label_names if counts[name] == 1]
    if single and len(names) >= 20:
        logger.warning("%s: %d class(es) with a single example (a mistyped label?): %s",
                       path, len(single), _listed([repr(name) for name in single]))


def _text(record: dict, field: str, path: str, where: str) -> str:
    value = record.get(field)
    if value is None or (isinstance(value, str) and not value.strip()):
        fields = ", ".join(map(str, record)) or "none"
        if field in record:
            raise InputError(f"{path}: {where}: the field {field!r} is empty; fix or drop "
                             "the record")
        raise InputError(f"{path}: {where}: no field {field!r} (fields: {fields}); "
                         "name the text field(s) with --text-field")
    return str(value)


def _value(raw, spec: TaskSpec, path: str, where: str) -> float:
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value):
        raise InputError(f"{path}: {where}: field {spec.label_field!r} holds {raw!r}, "
                         "not a number (a regression task's label)")
    return value


ID_COLUMNS = ("id", "idx", "index", "guid")  # never a text: left out when fields are chosen


def check_labelled_file(path: str, option: str | None = None, fields: dict | None = None):
    """Refuses a labelled file that is missing or of no format kroberta reads, and a CSV/TSV
    whose header lacks one of `fields` (field -> the option that names it). The check of
    `kroberta.finetune` and of the command line (which runs it before JAX starts): the
    readers below trust the path.

    Args:
        path: the file (or `datasets` directory).
        option: the option that named it, said before the path (None: the path alone).
        fields: the fields a CSV/TSV header must hold (None: none checked).
    """
    named = f"{option} {path}" if option else path
    if not (storage.isfile(path) or recordfiles.is_dataset_dir(path)):
        what = "a folder, not a file" if storage.isdir(path) else "no such file"
        raise NotFoundError(f"{named}: {what}")
    fmt = recordfiles.record_format(path)
    if fmt is None:
        raise InputError(f"{named}: not a labelled file kroberta reads (.tsv, .csv, .jsonl, "
                         ".json, .parquet, optionally .gz, or a datasets directory)")
    if fmt in ("csv", "tsv") and fields:
        records = recordfiles.iter_records(path, fmt, fields)
        try:
            next(records, None)  # the header, checked, and the first row
        finally:
            records.close()


def first_record_fields(path: str, columns: tuple | None = None) -> list:
    """The field names of a labelled file's first record (a CSV/TSV's header, or
    `columns`: a headerless file's)."""
    records = recordfiles.iter_records(path, recordfiles.record_format(path), {}, columns=columns)
    try:
        where, record = next(records, (None, None))
    finally:
        records.close()  # only the first record is read: the file closes now
    if where is None:
        raise InputError(f"{path}: holds no records")
    if not isinstance(record, dict):
        raise InputError(f"{path}: {where}: a JSON {type(record).__name__}, not an object")
    return list(record)


def choose_text_fields(path: str, label_field: str) -> tuple:
    """The text field(s) of a labelled file when none is named, as Hugging Face's run_glue
    chooses them: "text" when the file has it; else "sentence1" and "sentence2"; else its
    columns other than the label (and an id column): one is a single text, two a pair."""
    fields = first_record_fields(path)
    if "text" in fields:
        return ("text",)
    if "sentence1" in fields and "sentence2" in fields:
        chosen = ("sentence1", "sentence2")
    else:
        chosen = tuple(f for f in fields if f != label_field and str(f).lower() not in ID_COLUMNS)
        if not 1 <= len(chosen) <= 2:
            raise InputError(
                f"{path}: no field 'text', and {len(chosen)} fields besides the label "
                f"{label_field!r} ({', '.join(map(str, chosen)) or 'none'}); name the text with "
                "--text-field (twice for a pair)")
    logger.info("%s: no field 'text'; reading %s (the fields besides the label %r; name others "
                "with --text-field)", path, " and ".join(map(repr, chosen)) +
                (" as a text pair" if len(chosen) == 2 else " as the text"), label_field)
    return chosen


def read_labelled(path: str, spec: TaskSpec, label_names=None, require_labels: bool | None = True):
    """Reads one labelled file with prepare's readers (each format parsed one way).

    Args:
        path: a TSV/CSV, JSON lines (or JSON array), Parquet file or `datasets` directory
            (a DatasetDict's "train" split).
        spec: the task.
        label_names: the class names in id order (from the training file); None to
            take them from this file (spec.labels when the task fixes them).
        require_labels: False for texts to predict: labels are then read as 0 (and
            `has_labels` is False); None: read when the first record has the label
            field (a labelled file given to predict, to score it), else as False.

    Returns:
        (LabelledSet, label_names): label_names is None for regression.
    """
    fmt = recordfiles.record_format(path)
    if require_labels is None:
        require_labels = spec.label_field in first_record_fields(path, spec.columns)
    # field -> the option that names it, for a CSV header or Arrow schema that lacks it.
    fields = dict.fromkeys(spec.text_fields, TEXT_FIELD_OPTION)
    if require_labels:
        fields[spec.label_field] = "--label-field"
    texts, raw_labels, wheres = [[] for _ in spec.text_fields], [], []
    for where, record in recordfiles.iter_records(path, fmt, fields, columns=spec.columns):
        if not isinstance(record, dict):
            raise InputError(f"{path}: {where}: a JSON {type(record).__name__}, not an object")
        for column, field in zip(texts, spec.text_fields):
            column.append(_text(record, field, path, where))
        if not require_labels:
            continue
        if spec.label_field not in record:
            raise InputError(f"{path}: {where}: no label in field {spec.label_field!r} (fields: "
                             f"{', '.join(map(str, record)) or 'none'}; name it with --label-field)")
        if record[spec.label_field] in (None, ""):
            raise InputError(f"{path}: {where}: the label (field {spec.label_field!r}) is empty")
        raw_labels.append(record[spec.label_field])
        wheres.append(where)
    if not texts[0]:
        raise InputError(f"{path}: holds no records")
    if not require_labels:
        zeros = np.zeros(len(texts[0]), np.float32 if spec.kind == REGRESSION else np.int32)
        return LabelledSet(path, tuple(texts), zeros, has_labels=False), label_names
    if spec.kind == REGRESSION:
        labels = np.array([_value(v, spec, path, w) for v, w in zip(raw_labels, wheres)],
                          np.float32)
        return LabelledSet(path, tuple(texts), labels), None
    names = [label_name(v) for v in raw_labels]
    if label_names is None:
        label_names = spec.labels or tuple(sorted(set(names), key=_sort_key))
        _describe_classes(path, spec, names, label_names)
    ids = {name: i for i, name in enumerate(label_names)}
    for name, where in zip(names, wheres):
        if name not in ids:
            raise InputError(
                f"{path}: {where}: field {spec.label_field!r} holds the label {name!r}, which "
                f"the training data does not have (labels: {_listed(label_names)})")
    labels = np.array([ids[name] for name in names], np.int32)
    return LabelledSet(path, tuple(texts), labels), tuple(label_names)

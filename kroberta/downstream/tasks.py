"""The tasks a model is fine-tuned on, read and checked once: labelled files, GLUE and
the embedded task.

A `TaskSpec` says which field(s) hold the text (one, or a pair such as premise and
hypothesis), which holds the label, whether the task is classification or regression
and how it is scored. `read_labelled` turns one file (TSV/CSV, JSON lines, Parquet, a
`datasets` directory, through prepare's readers) into a `LabelledSet`: the texts, and
class ids (classification, the label set taken from the training file) or float values
(regression); each file is read once, its header too. Every bad record is an error
naming the file, record and field. `read_task` reads a whole task (`Task`): a labelled
file pair, a GLUE task or, with no data, the embedded one.

GLUE is read from its standard directory (never downloaded): each task's folder (CoLA,
SST-2, MRPC, STS-B, QQP, MNLI, QNLI, RTE, WNLI, as GLUE's download script names them)
holds train.tsv and dev.tsv (MNLI: dev_matched.tsv and dev_mismatched.tsv). The columns,
label sets and headerless CoLA follow Hugging Face's `transformers.data.processors.glue`;
every TSV is read as it does, without quoting (GLUE's sentences hold stray quotes). The
main metric is the one the RoBERTa paper's GLUE table reports: Matthews correlation for
CoLA, Pearson for STS-B, accuracy elsewhere (F1 and Spearman are reported beside them).

The embedded task ("stdlib") asks which package of the standard library a docstring is
from: text every machine has, as the default pretraining corpus (`kroberta.text.corpus`,
whose reader this reuses: docstrings read with `ast`, never by importing). The label is
the top-level package (asyncio, email, ...); the split is by module, so no file gives
docstrings to both training and validation, and a model must recognise a package's
register, not memorise a file. The default pretraining corpus leaves the validation
modules out: the task scores text the pretrained model never read. Each class is capped
so that no package dominates (chance is about 1 / the number of classes).

This module imports no JAX, Keras or TensorFlow: the command reads its task before they
load.
"""

import collections
import dataclasses
import logging
import math
import os
import sysconfig
from typing import NamedTuple

import numpy as np

from kroberta import storage
from kroberta.errors import InputError, NotFoundError
from kroberta.text import corpus, recordfiles
from kroberta.text.columns import TEXT_FIELD_OPTION

CLASSIFICATION, REGRESSION = "classification", "regression"
STDLIB = "stdlib"  # the embedded task's name
SHOWN_LABELS = 10  # class names a line lists before "... (N in all)"

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """How a labelled file is read and scored.

    Attributes:
        name: the task's name (in results and tables).
        text_fields: the field of the text, or the two fields of a text pair (None: chosen
            from the training file's fields, `choose_text_fields`).
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
            extra = (
                ("accuracy", "f1", "matthews", "macro_f1")
                if num_classes == 2
                else ("accuracy", "macro_f1")
            )
        return (self.metric,) + tuple(m for m in extra if m != self.metric)


@dataclasses.dataclass(frozen=True)
class LabelledSet:
    """One split: `texts` holds one list of strings per text field (`fields`, n each);
    `labels` is (n,) int32 class ids or float32 values (zeros when `has_labels` is False:
    texts to predict)."""

    path: str
    texts: tuple
    labels: np.ndarray
    has_labels: bool = True
    fields: tuple = ("text",)

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
    logger.info(
        "%s: %d examples of %d classes: %s",
        path,
        len(names),
        len(label_names),
        _listed([f"{name} ({counts[name]})" for name in label_names]),
    )
    fractional = [
        name for name in label_names if _sort_key(name)[0] == 0 and not float(name).is_integer()
    ]
    if fractional:
        logger.warning(
            "%s: field %r holds numbers such as %s, read as %d classes; for a "
            'score, fine-tune with --kind regression (kind="regression")',
            path,
            spec.label_field,
            ", ".join(fractional[:3]),
            len(label_names),
        )
    single = [name for name in label_names if counts[name] == 1]
    if single and len(names) >= 20:
        logger.warning(
            "%s: %d class(es) with a single example (a mistyped label?): %s",
            path,
            len(single),
            _listed([repr(name) for name in single]),
        )


def _text(record: dict, field: str, path: str, where: str) -> str:
    value = record.get(field)
    if value is None or (isinstance(value, str) and not value.strip()):
        fields = ", ".join(map(str, record)) or "none"
        if field in record:
            raise InputError(
                f"{path}: {where}: the field {field!r} is empty; fix or drop the record"
            )
        raise InputError(
            f"{path}: {where}: no field {field!r} (fields: {fields}); "
            "name the text field(s) with --text-field"
        )
    return str(value)


def _value(raw, spec: TaskSpec, path: str, where: str) -> float:
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value):
        raise InputError(
            f"{path}: {where}: field {spec.label_field!r} holds {raw!r}, "
            "not a number (a regression task's label)"
        )
    return value


ID_COLUMNS = ("id", "idx", "index", "guid")  # never a text: left out when fields are chosen


def check_labelled_file(path: str, option: str | None = None):
    """Refuses a labelled file that is missing or of no format kroberta reads: the check
    where a path comes in (`read_task`, the command's --predict); the readers trust it.

    Args:
        path: the file (or `datasets` directory).
        option: the option that named it, said before the path (None: the path alone).
    """
    named = f"{option} {path}" if option else path
    if not (storage.isfile(path) or recordfiles.is_dataset_dir(path)):
        what = "a folder, not a file" if storage.isdir(path) else "no such file"
        raise NotFoundError(f"{named}: {what}")
    if recordfiles.record_format(path) is None:
        raise InputError(
            f"{named}: not a labelled file kroberta reads (.tsv, .csv, .jsonl, "
            ".json, .parquet, optionally .gz, or a datasets directory)"
        )


def choose_text_fields(path: str, fields: list, label_field: str) -> tuple:
    """The text field(s) of a labelled file when none is named, from its first record's
    `fields`, as Hugging Face's run_glue chooses them: "text" when the file has it; else
    "sentence1" and "sentence2"; else its columns other than the label (and an id
    column): one is a single text, two a pair."""
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
                "--text-field (twice for a pair)"
            )
    logger.info(
        "%s: no field 'text'; reading %s (the fields besides the label %r; name others "
        "with --text-field)",
        path,
        " and ".join(map(repr, chosen))
        + (" as a text pair" if len(chosen) == 2 else " as the text"),
        label_field,
    )
    return chosen


def read_labelled(path: str, spec: TaskSpec, label_names=None, require_labels: bool | None = True):
    """Reads one labelled file with prepare's readers (each format parsed one way), once.

    Args:
        path: a TSV/CSV, JSON lines (or JSON array), Parquet file or `datasets` directory
            (a DatasetDict's "train" split).
        spec: the task; its `text_fields` None: chosen from the first record's fields
            (`choose_text_fields`; the set's `fields` says which).
        label_names: the class names in id order (from the training file); None to
            take them from this file (spec.labels when the task fixes them).
        require_labels: False for texts to predict: labels are then read as 0 (and
            `has_labels` is False); None: read when the first record has the label
            field (a labelled file given to predict, to score it), else as False.

    Returns:
        (LabelledSet, label_names): label_names is None for regression.
    """
    # field -> the option that names it, for a CSV header or Arrow schema that lacks it.
    fields = dict.fromkeys(spec.text_fields or (), TEXT_FIELD_OPTION)
    if require_labels:
        fields[spec.label_field] = "--label-field"
    text_fields, texts, raw_labels, wheres = spec.text_fields, None, [], []
    for where, record in recordfiles.iter_records(
        path, recordfiles.record_format(path), fields, columns=spec.columns
    ):
        if not isinstance(record, dict):
            raise InputError(f"{path}: {where}: a JSON {type(record).__name__}, not an object")
        if texts is None:  # the first record: what the file holds decides what is read
            if require_labels is None:
                require_labels = spec.label_field in record
            text_fields = text_fields or choose_text_fields(path, list(record), spec.label_field)
            texts = [[] for _ in text_fields]
        for column, field in zip(texts, text_fields):
            column.append(_text(record, field, path, where))
        if not require_labels:
            continue
        if spec.label_field not in record:
            raise InputError(
                f"{path}: {where}: no label in field {spec.label_field!r} (fields: "
                f"{', '.join(map(str, record)) or 'none'}; name it with --label-field)"
            )
        if record[spec.label_field] in (None, ""):
            raise InputError(
                f"{path}: {where}: the label (field {spec.label_field!r}) is empty; "
                "fix or drop the record"
            )
        raw_labels.append(record[spec.label_field])
        wheres.append(where)
    if texts is None:
        raise InputError(f"{path}: holds no records")
    texts, text_fields = tuple(texts), tuple(text_fields)
    if not require_labels:
        zeros = np.zeros(len(texts[0]), np.float32 if spec.kind == REGRESSION else np.int32)
        return LabelledSet(path, texts, zeros, False, text_fields), label_names
    if spec.kind == REGRESSION:
        labels = np.array(
            [_value(v, spec, path, w) for v, w in zip(raw_labels, wheres)], np.float32
        )
        return LabelledSet(path, texts, labels, True, text_fields), None
    names = [label_name(v) for v in raw_labels]
    if label_names is None:
        label_names = spec.labels or tuple(sorted(set(names), key=_sort_key))
        _describe_classes(path, spec, names, label_names)
    ids = {name: i for i, name in enumerate(label_names)}
    for name, where in zip(names, wheres):
        if name not in ids:
            raise InputError(
                f"{path}: {where}: field {spec.label_field!r} holds the label {name!r}, which "
                f"the training data does not have (labels: {_listed(label_names)})"
            )
    labels = np.array([ids[name] for name in names], np.int32)
    return LabelledSet(path, texts, labels, True, text_fields), tuple(label_names)


# ---------------------------------------------------------------- GLUE

_BINARY = ("0", "1")
_NLI = ("entailment", "not_entailment")


def _glue(name, fields, label, **kwargs):
    return TaskSpec(f"glue/{name}", fields, label, **kwargs)


# task -> (folder in the GLUE directory, spec)
GLUE_TASKS = {
    "cola": (
        "CoLA",
        _glue(
            "cola",
            ("sentence",),
            "label",
            metric="matthews",
            labels=_BINARY,
            columns=("source", "label", "label_notes", "sentence"),
        ),
    ),
    "sst2": ("SST-2", _glue("sst2", ("sentence",), "label", labels=_BINARY)),
    "mrpc": ("MRPC", _glue("mrpc", ("#1 String", "#2 String"), "Quality", labels=_BINARY)),
    "stsb": (
        "STS-B",
        _glue("stsb", ("sentence1", "sentence2"), "score", kind=REGRESSION, metric="pearson"),
    ),
    "qqp": ("QQP", _glue("qqp", ("question1", "question2"), "is_duplicate", labels=_BINARY)),
    "mnli": (
        "MNLI",
        _glue(
            "mnli",
            ("sentence1", "sentence2"),
            "gold_label",
            labels=("contradiction", "entailment", "neutral"),
        ),
    ),
    "qnli": ("QNLI", _glue("qnli", ("question", "sentence"), "label", labels=_NLI)),
    "rte": ("RTE", _glue("rte", ("sentence1", "sentence2"), "label", labels=_NLI)),
    "wnli": ("WNLI", _glue("wnli", ("sentence1", "sentence2"), "label", labels=_BINARY)),
}
# Evaluation files by name; the first one chooses the learning rate.
_GLUE_DEV_FILES = {"mnli": {"matched": "dev_matched.tsv", "mismatched": "dev_mismatched.tsv"}}


def is_glue(task: str | None) -> bool:
    return task is not None and task.lower().startswith("glue/")


def glue_task_name(task: str) -> str:
    """ "glue/sst2" (or "sst2", "SST-2") -> "sst2"; an unknown name is an error listing them."""
    name = task.lower().removeprefix("glue/").replace("-", "")
    if name not in GLUE_TASKS:
        raise InputError(
            f"--task {task!r}: not a GLUE task (GLUE tasks: "
            f"{', '.join('glue/' + t for t in GLUE_TASKS)})"
        )
    return name


def glue_spec(task: str) -> TaskSpec:
    return GLUE_TASKS[glue_task_name(task)][1]


def glue_files(task: str, directory: str) -> tuple[str, dict]:
    """(train file, {evaluation name: file}) of a GLUE task in `directory`: the task's own
    folder, or the GLUE directory that holds it."""
    name = glue_task_name(task)
    folder = directory
    if not os.path.isfile(os.path.join(directory, "train.tsv")):
        folder = os.path.join(directory, GLUE_TASKS[name][0])
    dev = _GLUE_DEV_FILES.get(name, {"dev": "dev.tsv"})
    paths = [os.path.join(folder, f) for f in ("train.tsv", *dev.values())]
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise InputError(
            f"--data {directory}: glue/{name} needs {', '.join(missing)} "
            f"(GLUE's {GLUE_TASKS[name][0]} folder, or the GLUE directory holding it)"
        )
    return paths[0], dict(zip(dev, paths[1:]))


def glue_tasks_present(directory: str) -> list[str]:
    """The GLUE tasks whose folders (with train.tsv) are in `directory`, in GLUE's order."""
    found = [
        name
        for name, (folder, _) in GLUE_TASKS.items()
        if os.path.isfile(os.path.join(directory, folder, "train.tsv"))
    ]
    if not found:
        raise InputError(
            f"--data {directory}: holds no GLUE task folder with a "
            f"train.tsv ({', '.join(f for f, _ in GLUE_TASKS.values())})"
        )
    return found


# ---------------------------------------------------------------- the embedded task

STDLIB_PACKAGES = corpus.TASK_PACKAGES  # tried in this order
STDLIB_CLASSES = 6
STDLIB_PER_CLASS = (320, 80)  # at most this many (training, validation) docstrings per package
STDLIB_SPEC = TaskSpec(STDLIB, ("text",), "label")


def _stdlib_package_splits(root: str, package: str) -> tuple[list, list]:
    """(training, validation) docstrings of one package, split by module
    (`corpus.task_modules`: the default pretraining corpus leaves the validation ones out)."""
    return tuple(
        [" ".join(doc.split()) for path in files for doc in corpus.file_docstrings(path)]
        for files in corpus.task_modules(root, package)
    )


def stdlib_splits(root: str | None = None, seed: int = 0):
    """The embedded task's (train, validation) `LabelledSet`s and its label names.

    Args:
        root: the stdlib directory (default: this interpreter's).
        seed: which docstrings a capped package keeps.
    """
    root = root or sysconfig.get_paths()["stdlib"]
    rng = np.random.default_rng(seed)
    chosen = {}
    for package in STDLIB_PACKAGES:
        train, validation = _stdlib_package_splits(root, package)
        if len(train) >= STDLIB_PER_CLASS[0] // 4 and len(validation) >= STDLIB_PER_CLASS[1] // 4:
            chosen[package] = (train, validation)
        if len(chosen) == STDLIB_CLASSES:
            break
    names = tuple(chosen)
    result = []
    for part, cap in enumerate(STDLIB_PER_CLASS):
        texts, labels = [], []
        for label, package in enumerate(names):
            docs = chosen[package][part]
            keep = sorted(rng.permutation(len(docs))[:cap])
            texts += [docs[i] for i in keep]
            labels += [label] * len(keep)
        result.append(
            LabelledSet(
                f"<stdlib {('train', 'validation')[part]}>", (texts,), np.array(labels, np.int32)
            )
        )
    return result[0], result[1], names


# ---------------------------------------------------------------- a whole task


class Task(NamedTuple):
    """A task read: its spec (text fields chosen), class names (None: regression), the
    training `LabelledSet` and {split: LabelledSet} to evaluate (the first chooses)."""

    spec: TaskSpec
    label_names: tuple | None
    train: LabelledSet
    evaluation: dict


def check_task(task: str | None, data, validation):
    """Refuses a task without the files it needs (`kroberta.finetune`'s `task`, `data`
    and `validation`; the command's --task, --data and --validation)."""
    if validation is not None and data is None:
        raise InputError(
            "validation (--validation) without data (--data, the training "
            "file): a labelled task needs both"
        )
    if is_glue(task):
        glue_task_name(task)
        if data is None:
            raise InputError(
                f"--task {task}: needs --data, the GLUE directory (or the "
                "task's folder) holding train.tsv and dev.tsv"
            )
    elif (task not in (None, STDLIB) or data is not None) and validation is None:
        raise InputError(
            "a labelled task needs both data (the training file, "
            "--data) and validation (--validation)"
        )


def read_task(
    task: str | None,
    data=None,
    validation=None,
    text_fields=None,
    label_field: str = "label",
    kind: str = CLASSIFICATION,
    flags: bool = False,
) -> Task:
    """The task asked for, checked and read (each file once): "glue/<task>" with `data` the
    GLUE directory, a labelled file pair (`data`, `validation`; `task` names it), or with
    no data the embedded task. `flags`: files are named as the command's options
    (`--data x: no such file`), else by their path alone."""
    check_task(task, data, validation)
    if task in (None, STDLIB) and data is None:
        train, evaluation, names = stdlib_splits()
        return Task(STDLIB_SPEC, names, train, {"validation": evaluation})
    if is_glue(task):
        spec = glue_spec(task)
        train_path, evaluation_paths = glue_files(task, os.fspath(data))
    else:
        if kind not in (CLASSIFICATION, REGRESSION):
            raise InputError(f"--kind {kind!r}: expected {CLASSIFICATION} or {REGRESSION}")
        if isinstance(text_fields, str):
            text_fields = (text_fields,)
        if text_fields is not None and not 1 <= len(text_fields) <= 2:
            raise InputError(f"--text-field: one text or a pair, got {len(text_fields)}")
        train_path, evaluation_paths = os.fspath(data), {"validation": os.fspath(validation)}
        check_labelled_file(train_path, "--data" if flags else None)
        check_labelled_file(evaluation_paths["validation"], "--validation" if flags else None)
        metric = "pearson" if kind == REGRESSION else "accuracy"
        spec = TaskSpec(
            task or os.path.basename(train_path),
            tuple(text_fields) if text_fields else None,
            label_field,
            kind,
            metric,
        )
    train, names = read_labelled(train_path, spec)
    spec = dataclasses.replace(spec, text_fields=train.fields)  # as chosen from the file
    evaluation = {
        split: read_labelled(path, spec, names)[0] for split, path in evaluation_paths.items()
    }
    return Task(spec, names, train, evaluation)

"""The GLUE tasks as the standard GLUE directory holds them (never downloaded).

Each task's folder (CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI, RTE, WNLI, as GLUE's
download script names them) holds train.tsv and dev.tsv (MNLI: dev_matched.tsv and
dev_mismatched.tsv). The columns, label sets and headerless CoLA follow Hugging
Face's `transformers.data.processors.glue`; kroberta reads every TSV as it does,
without quoting (quotechar=None: GLUE's sentences hold stray quotes). The main metric
is the one the RoBERTa paper's GLUE table reports: Matthews correlation for CoLA,
Pearson for STS-B, accuracy elsewhere (F1 and Spearman are reported beside them).
"""

import os

from kroberta.downstream.examples import REGRESSION, TaskSpec
from kroberta.errors import InputError

_BINARY = ("0", "1")
_NLI = ("entailment", "not_entailment")


def _spec(name, fields, label, **kwargs):
    return TaskSpec(f"glue/{name}", fields, label, **kwargs)


# task -> (folder in the GLUE directory, spec)
TASKS = {
    "cola": ("CoLA", _spec("cola", ("sentence",), "label", metric="matthews", labels=_BINARY,
                           columns=("source", "label", "label_notes", "sentence"))),
    "sst2": ("SST-2", _spec("sst2", ("sentence",), "label", labels=_BINARY)),
    "mrpc": ("MRPC", _spec("mrpc", ("#1 String", "#2 String"), "Quality", labels=_BINARY)),
    "stsb": ("STS-B", _spec("stsb", ("sentence1", "sentence2"), "score", kind=REGRESSION,
                            metric="pearson")),
    "qqp": ("QQP", _spec("qqp", ("question1", "question2"), "is_duplicate", labels=_BINARY)),
    "mnli": ("MNLI", _spec("mnli", ("sentence1", "sentence2"), "gold_label",
                           labels=("contradiction", "entailment", "neutral"))),
    "qnli": ("QNLI", _spec("qnli", ("question", "sentence"), "label", labels=_NLI)),
    "rte": ("RTE", _spec("rte", ("sentence1", "sentence2"), "label", labels=_NLI)),
    "wnli": ("WNLI", _spec("wnli", ("sentence1", "sentence2"), "label", labels=_BINARY)),
}
# Evaluation files by name; the first one chooses the learning rate.
_DEV_FILES = {"mnli": {"matched": "dev_matched.tsv", "mismatched": "dev_mismatched.tsv"}}


def task_name(task: str) -> str:
    """"glue/sst2" (or "sst2", "SST-2") -> "sst2"; an unknown name is an error listing them."""
    name = task.lower().removeprefix("glue/").replace("-", "")
    if name not in TASKS:
        raise InputError(f"--task {task!r}: not a GLUE task (GLUE tasks: "
                         f"{', '.join('glue/' + t for t in TASKS)})")
    return name


def spec(task: str) -> TaskSpec:
    return TASKS[task_name(task)][1]


def task_files(task: str, directory: str) -> tuple[str, dict]:
    """(train file, {evaluation name: file}) of a task in `directory`: the task's own
    folder, or the GLUE directory that holds it."""
    name = task_name(task)
    folder = directory
    if not os.path.isfile(os.path.join(directory, "train.tsv")):
        folder = os.path.join(directory, TASKS[name][0])
    dev = _DEV_FILES.get(name, {"dev": "dev.tsv"})
    paths = [os.path.join(folder, f) for f in ("train.tsv", *dev.values())]
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise InputError(f"--data {directory}: glue/{name} needs {', '.join(missing)} "
                         f"(GLUE's {TASKS[name][0]} folder, or the GLUE directory holding it)")
    return paths[0], dict(zip(dev, paths[1:]))


def tasks_present(directory: str) -> list[str]:
    """The GLUE tasks whose folders (with train.tsv) are in `directory`, in GLUE's order."""
    found = [name for name, (folder, _) in TASKS.items()
             if os.path.isfile(os.path.join(directory, folder, "train.tsv"))]
    if not found:
        raise InputError(f"--data {directory}: holds no GLUE task folder with a "
                         f"train.tsv ({', '.join(f for f, _ in TASKS.values())})")
    return found

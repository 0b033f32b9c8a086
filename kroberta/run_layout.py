"""The files of a run directory, reading its config and tokenizer, and telling which model
a directory holds.

A training run, a fine-tuned classifier's folder and the model `kroberta.save` writes
share these names; `training/` writes them and `downstream/` reads them, so they live
below both.
The file that marks each other kind of output (prepared data's manifest, an export's
weights or metadata) is named here too (`OUTPUT_MARKERS`): a run or an export refuses
to mix into another kind's folder.

    config.toml             the resolved config (`kroberta.config.Config`)
    model.weights.h5        the final masked LM's Keras weights
    tokenizer.json          the tokenizer the data was prepared with (when it had one)
    classifier.json         marks a fine-tuned classifier's folder (its task, labels, length)
    classifier.weights.h5   the fine-tuned classifier's Keras weights
    trials.jsonl            a fine-tune's finished trials, which resume it (`downstream.trial`)

`model_source` tells the three sources `kroberta.load` reads (a kroberta directory, a
Hugging Face directory, a keras-hub preset) and the head each holds from their files
alone, through `kroberta.storage`: a command names a wrong path before JAX starts, as
it names an --out a fine-tune must not write into (`check_finetune_out`).
"""

import json
import os
import re

from kroberta import storage
from kroberta.config import load_toml
from kroberta.errors import ArgumentKindError, InputError, NotFoundError

WEIGHTS_FILE = "model.weights.h5"
CONFIG_FILE = "config.toml"
TOKENIZER_FILE = "tokenizer.json"
CLASSIFIER_FILE = "classifier.json"
CLASSIFIER_WEIGHTS_FILE = "classifier.weights.h5"
TRIALS_FILE = "trials.jsonl"
CHECKPOINT_DIR = "checkpoints"  # a run's checkpoints/step_N folders
MANIFEST_NAME = "manifest.json"  # marks prepared data, written last (`data.manifest`)
SAFETENSORS_FILE = "model.safetensors"  # a Hugging Face model's weights
METADATA_FILE = "metadata.json"  # marks a keras-hub preset (its version record)

# The file that marks each kind of output a directory may hold, and what the directory
# then is: a run or an export refuses to mix into another kind (`marked_output`).
OUTPUT_MARKERS = {
    "prepared data": (MANIFEST_NAME, "prepared data"),
    "classifier": (CLASSIFIER_FILE, "a fine-tuned classifier's folder"),
    "run": (CONFIG_FILE, "a kroberta run"),
    "checkpoints": (CHECKPOINT_DIR, "a kroberta run"),
    "hf": (SAFETENSORS_FILE, "a Hugging Face export"),
    "keras-hub": (METADATA_FILE, "a keras-hub preset"),
}

# The sources `model_source` tells apart, and the two heads.
RUN, HF, KERAS_HUB = "run", "hf", "keras-hub"
MASKED_LM, CLASSIFIER = "masked LM", "fine-tuned classifier"
MODEL_KINDS = "a training run, a Hugging Face RoBERTa directory or a keras-hub preset directory"
HF_CLASSIFIER = "RobertaForSequenceClassification"
KERAS_HUB_CLASSIFIER = "RobertaTextClassifier"


def marked_output(directory: str, kinds) -> tuple[str, str] | None:
    """(marker file, what the directory is) of the first of `kinds` (`OUTPUT_MARKERS`'
    keys, in order) whose marker `directory` holds; None when it holds none."""
    for kind in kinds:
        marker, what = OUTPUT_MARKERS[kind]
        if storage.exists(storage.join(directory, marker)):
            return marker, what
    return None


def load_run_config(run_dir: str):
    """The run's resolved config (its config.toml)."""
    path = storage.join(run_dir, CONFIG_FILE)
    with storage.local_copy(path) as local:
        return load_toml(local)


def load_tokenizer(run_dir: str):
    """The run's `tokenizers.Tokenizer`, or None when it has no tokenizer.json."""
    tokenizer_path = storage.join(run_dir, TOKENIZER_FILE)
    if not storage.isfile(tokenizer_path):
        return None
    from tokenizers import Tokenizer  # start-up time: commands check paths before it loads

    text = storage.read_text(tokenizer_path)
    try:
        return Tokenizer.from_str(text)
    except Exception as e:  # the library raises a bare Exception on malformed JSON
        raise InputError(
            f"{tokenizer_path}: cannot read this tokenizer: damaged or not a tokenizer's JSON ({e})"
        ) from None


def read_json(path: str, default=None):
    """The JSON file at `path` (local or a URL), or `default` when it is missing or no JSON."""
    try:
        return json.loads(storage.read_text(path))
    except (OSError, ValueError):
        return default


def model_source(path, key: str = "kroberta.load", head: str | None = None) -> tuple[str, str]:
    """(source, head) of the model in directory `path`: source `RUN` (config.toml: a
    training run, `kroberta.save`'s or a fine-tuned classifier's folder), `KERAS_HUB`
    (metadata.json, or a config.json naming its class) or `HF` (a config.json with a
    model_type); head `MASKED_LM` or `CLASSIFIER`.

    Args:
        path: the directory given.
        key: what named it (`--model`, `kroberta.load`), to start an error message.
        head: the head the caller needs (`MASKED_LM`, `CLASSIFIER`); None: either.

    Raises:
        ArgumentKindError: `path` is no path.
        NotFoundError: no such directory, or it holds none of the three (the message says
            what it is instead: a file, prepared data, a checkpoint of a run).
        InputError: it holds the other head than `head`.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise ArgumentKindError(
            f"{key}: expected a directory's path, got {type(path).__name__}"
            + (" (a model already: use it as it is)" if hasattr(path, "predict") else "")
        )
    path = os.fspath(path)
    found = _source(path, key, CLASSIFIER if head == CLASSIFIER else "finished kroberta run")
    if head and found[1] != head:
        raise InputError(
            f"{key}: {path} holds a {found[1]}, not a {head}"
            + (
                f"; give {MODEL_KINDS} of a masked LM"
                if head == MASKED_LM
                else f"; fine-tune it with --run {path}"
            )
        )
    return found


def _source(path: str, key: str, wanted: str) -> tuple[str, str]:
    if storage.isfile(path):
        raise NotFoundError(
            f"{key}: {path}: a file, not a directory; give the directory that "
            f"holds it ({os.path.dirname(path) or '.'})"
        )
    if not storage.isdir(path):
        raise NotFoundError(f"{key}: {path}: no such directory; give {MODEL_KINDS}")
    if storage.isfile(storage.join(path, CONFIG_FILE)):
        classifier = storage.isfile(storage.join(path, CLASSIFIER_FILE))
        return RUN, CLASSIFIER if classifier else MASKED_LM
    if storage.isfile(storage.join(path, MANIFEST_NAME)):
        raise NotFoundError(
            f"{key}: {path}: prepared data (python -m kroberta.prepare's "
            f"output), not a model; give {MODEL_KINDS}"
        )
    parent, name = os.path.split(os.path.normpath(path))
    if os.path.basename(parent) == CHECKPOINT_DIR and re.fullmatch(r"step_\d+", name):
        run = os.path.dirname(parent)
        raise NotFoundError(
            f"{key}: {path}: a checkpoint of the run {run}: give the run "
            f"(kroberta.load({run!r}, checkpoint={int(name[5:])}); the "
            "commands take its latest)"
        )
    described = read_json(storage.join(path, "config.json"))
    described = described if isinstance(described, dict) else {}
    if storage.isfile(storage.join(path, METADATA_FILE)) or "registered_name" in described:
        task = read_json(storage.join(path, "task.json"), {})
        task = str(task.get("registered_name", "") if isinstance(task, dict) else "")
        return KERAS_HUB, CLASSIFIER if task.endswith(KERAS_HUB_CLASSIFIER) else MASKED_LM
    if "model_type" in described:
        return HF, CLASSIFIER if HF_CLASSIFIER in (
            described.get("architectures") or ()
        ) else MASKED_LM
    raise NotFoundError(
        f"{key}: {path}: not a {wanted} ({CONFIG_FILE} is "
        "missing), and no config.json of a Hugging Face model or keras-hub "
        f"preset; give {MODEL_KINDS}"
    )


def check_finetune_out(out: str | None):
    """Refuses a fine-tune's --out that is a file, or a folder holding other files than a
    fine-tune's (a pretraining run's: its config.toml and tokenizer.json would be overwritten)."""
    if out is None:
        return
    out = os.fspath(out)
    if os.path.exists(out) and not os.path.isdir(out):
        raise InputError(f"--out {out}: a file, not a folder; name a folder (it is created)")
    names = set(os.listdir(out)) if os.path.isdir(out) else set()
    if names and not names & {TRIALS_FILE, CLASSIFIER_FILE}:
        kind = "a pretraining run" if CONFIG_FILE in names else "other files"
        raise InputError(
            f"--out {out}: holds {kind}, not a fine-tune's trials; give a new or "
            "empty folder (or one an earlier fine-tune wrote, to resume it)"
        )

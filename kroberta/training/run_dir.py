"""The run directory before any compute: enough disk, clean history, what a
resumed run may change; its config.toml and tokenizer written (`prepare_run_dir`)."""

import contextlib
import dataclasses
import json
import logging
import os
import shutil

from kroberta import run_layout, storage
from kroberta.config import Config, to_dict, to_toml
from kroberta.errors import ConfigError
from kroberta.text import locations
from kroberta.training import checkpoint, trackers

METRICS_FILE = "metrics.jsonl"  # a JSON row per log interval and evaluation
# The probe's rows (`train.downstream`): split "downstream/<task>" (with "/<split>" when the
# task has several); the same probe on a random initialisation of the run's shape, once
# per run, is "<that>/random_init": the line a pretrained model must beat.
PROBE_PREFIX = "downstream/"
RANDOM_INIT = "random_init"
# A probe row's main metric minus the random initialisation's on the same texts, and the
# ends of its 95% bootstrap interval over them: PROBE_GAP, PROBE_GAP + "_low", + "_high".
PROBE_GAP = "vs_random_init"


def is_probe_reference(split: str) -> bool:
    """Whether a metrics row's split is the probe's random-initialisation reference."""
    return split.startswith(PROBE_PREFIX) and split.endswith("/" + RANDOM_INIT)


logger = logging.getLogger(__name__)


def metrics_rows(run_dir: str, last_step: int | None = None, warn: bool = False) -> list[dict]:
    """metrics.jsonl's rows (up to `last_step`; none when there is no file), skipping a
    line a kill cut short (with a warning when `warn`)."""
    return _read_rows(storage.join(run_dir, METRICS_FILE), last_step, warn)[0]


def _read_rows(path: str, last_step: int | None, warn: bool) -> tuple[list[dict], int]:
    """(the rows up to `last_step`, how many lines the file has that are not blank)."""
    if not storage.isfile(path):
        return [], 0
    lines = [line for line in storage.read_text(path).splitlines() if line.strip()]
    rows = []
    for number, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if warn:
                logger.warning(f"warning: {path}:{number}: not JSON, skipped")
            continue
        if last_step is None or row.get("step", 0) <= last_step:
            rows.append(row)
    return rows, len(lines)


# Other outputs a run would mix into (`run_layout.OUTPUT_MARKERS`).
_NOT_RUNS = ("prepared data", "classifier", "hf", "keras-hub")


@dataclasses.dataclass(frozen=True)
class RunDirState:
    """What a run directory holds when `train` starts, read once (`read_run_dir`) and
    handed to whatever decides from it: starting afresh or resuming, and from what."""

    path: str
    created: bool  # a local directory that was not there: this call creates it
    checkpoints: tuple  # the complete checkpoints as (step, path), oldest first
    recorded: Config | None  # the config.toml of a run with a checkpoint to resume
    model: str | None  # the final model's weights file, when a finished run saved one


def read_run_dir(run_dir: str) -> RunDirState:
    """The state of `run_dir` (checked by `config.validate` already).

    Raises ConfigError when it holds another kind of output (`_NOT_RUNS`)."""
    other = run_layout.marked_output(run_dir, _NOT_RUNS)
    if other:
        raise ConfigError(
            f"run_dir: {run_dir} holds {other[1]} ({other[0]}); a run goes "
            "into a directory of its own: use another --run_dir"
        )
    saved = tuple(checkpoint.list_checkpoints(run_dir))
    recorded = None
    if saved and storage.isfile(storage.join(run_dir, run_layout.CONFIG_FILE)):
        recorded = run_layout.load_run_config(run_dir)
    created = not storage.is_url(run_dir) and not os.path.exists(run_dir)
    model = storage.join(run_dir, run_layout.WEIGHTS_FILE)
    return RunDirState(run_dir, created, saved, recorded, model if storage.isfile(model) else None)


@contextlib.contextmanager
def removed_unless_checkpointed(state: RunDirState):
    """Removes the run directory when the block fails and the directory did not exist
    before it and holds no checkpoint and no logged step: a run that never started leaves
    nothing half-made behind.
    Local directories of a single-process run only (in a job another process may be
    writing there)."""
    run_dir = state.path
    try:
        yield
    except BaseException:
        if state.created and os.path.isdir(run_dir):
            # start-up: `train` reads this module before JAX loads
            import jax

            metrics = os.path.join(run_dir, METRICS_FILE)
            # A run that logged a step (then diverged, say) keeps what it wrote.
            if (
                jax.process_count() == 1
                and not checkpoint.list_checkpoints(run_dir)
                and not (os.path.isfile(metrics) and os.path.getsize(metrics) > 0)
            ):
                shutil.rmtree(run_dir, ignore_errors=True)
        raise


def resumed_history(run_dir: str, step: int, write: bool) -> list[dict]:
    """metrics.jsonl's rows up to `step`, where the run goes on from: read once for all
    that replays them (the early stop, the best checkpoint, the probe's reference).
    With `write` (process 0), rows logged after `step` (by a run killed after its last
    checkpoint) and a line the kill cut short are dropped from the file, so the resumed
    run's rows neither repeat nor leave gaps."""
    path = storage.join(run_dir, METRICS_FILE)
    kept, lines = _read_rows(path, step, warn=False)
    if write and len(kept) < lines:
        # Each row written again as `json.dumps` wrote it: the same line.
        storage.write_text(path, "".join(json.dumps(row) + "\n" for row in kept))
        logger.info(
            f"{METRICS_FILE}: dropped {lines - len(kept)} row(s) logged after step {step}, "
            "the checkpoint this run resumes from"
        )
    return kept


# The settings that decide, with the checkpoint, which weights a run ends with. Changing
# one on a resumed or finished run would leave its config.toml describing a model it did
# not train, so it is refused unless asked for (then recorded). Every other setting
# (logging, evaluation, checkpoints, devices and layout, run_dir, init sources) may change
# on resume and is recorded. The model's shape has its own check (a different model).
TRAINING_KEYS = {
    "data": (
        "dir",
        "train",
        "masking",
        "mask_rate",
        "max_predictions",
        "shuffle_buffer",
        "pad_token_id",
        "mask_token_id",
        "special_token_ids",
        "whole_word_masking",
    ),
    "train": (
        "batch_size_per_device",
        "gradient_accumulation_steps",
        "steps",
        "time_budget",
        "learning_rate",
        "warmup_steps",
        "warmup_fraction",
        "schedule",
        "weight_decay",
        "clip_norm",
        "adam_beta_1",
        "adam_beta_2",
        "adam_epsilon",
        "mixed_precision",
        "seed",
        "min_learning_rate",
        "decay_steps",
        "decay_fraction",
    ),
}
CHANGES_FILE = "config_changes.jsonl"


def _comparable(section: str, key: str, value):
    if section == "data" and key in ("dir", "train", "validation"):
        # The same files named from another working directory are the same data.
        paths = [value] if isinstance(value, str) else list(value)
        return [storage.absolute(p) if p else p for p in paths]
    return list(value) if isinstance(value, tuple) else value


def changed_settings(previous: dict, current: dict) -> tuple[dict, dict]:
    """(training settings, other settings) that differ between two configs as dicts
    (`config.to_dict`), each {"section.key": [before, now]}; model keys are not compared."""
    training, other = {}, {}
    for section, values in current.items():
        if section == "model":
            continue
        if not isinstance(values, dict):  # a top-level key (run_dir, init_from_*)
            if _comparable("", section, previous.get(section)) != _comparable("", section, values):
                other[section] = [previous.get(section), values]
            continue
        before = previous.get(section, {})
        for key, value in values.items():
            old = before.get(key)
            if _comparable(section, key, old) == _comparable(section, key, value):
                continue
            target = training if key in TRAINING_KEYS.get(section, ()) else other
            target[f"{section}.{key}"] = [
                _comparable(section, key, old),
                _comparable(section, key, value),
            ]
    return training, other


def describe_changes(changes: dict) -> str:
    return ", ".join(f"{key} {before!r} -> {now!r}" for key, (before, now) in changes.items())


def prepare_run_dir(
    config: Config, state: RunDirState, force: bool, accept_changes: bool, write: bool
) -> RunDirState:
    """Makes the run dir and writes config.toml into it; refuses a run with another model, or
    with other training settings (`TRAINING_KEYS`) unless `accept_changes`;
    records every change of setting in config_changes.jsonl.

    Every process checks; only process 0 (`write`) changes the run directory.
    Returns `state` as the run goes on from it: without checkpoints when it starts over.
    """
    saved, previous = state.checkpoints, state.recorded
    changes, starts_over = {}, False
    if previous is not None:
        # A new start (initializer_range) is not a new model: the checkpoint holds its weights.
        before, now = previous.model.trained_model(), config.model.trained_model()
        other_model = before != now
        if other_model and not force:
            changed = [k for k in to_dict(config)["model"] if getattr(before, k) != getattr(now, k)]
            raise ConfigError(
                f"run_dir: {config.run_dir} holds a run of a different model "
                f"(changed: {', '.join('model.' + k for k in changed)}); use another "
                "--run_dir, or --force (force=True) to start this model there from scratch"
            )
        training, other = changed_settings(to_dict(previous), to_dict(config))
        if training and not force and not accept_changes:
            raise ConfigError(
                f"run_dir: {config.run_dir} holds a run trained with other settings "
                f"({describe_changes(training)}); use another --run_dir, --force (force=True) "
                "to start over there, or --accept-changes (accept_changes=True) to continue its "
                f"checkpoint with these settings (recorded in {CHANGES_FILE})"
            )
        starts_over = force and bool(other_model or training)
        changes = {} if starts_over else {**training, **other}
    going_on = dataclasses.replace(state, checkpoints=(), recorded=None) if starts_over else state
    if not write:
        return going_on
    storage.makedirs(config.run_dir)  # the tokenizer and checkpoints go in it next
    if starts_over:
        storage.rmtree(storage.join(config.run_dir, checkpoint.CHECKPOINT_DIR))
        trackers.forget_runs(config.run_dir)  # a new start: new tracker runs
    if changes:
        # One row per change: the step from which the new settings apply.
        storage.append_text(
            storage.join(config.run_dir, CHANGES_FILE),
            json.dumps({"step": saved[-1][0], "changed": changes}) + "\n",
        )
        logger.info(
            f"run_dir: continuing step {saved[-1][0]} with changed settings: "
            f"{describe_changes(changes)} (recorded in {CHANGES_FILE})"
        )
    storage.write_text(storage.join(config.run_dir, run_layout.CONFIG_FILE), to_toml(config))
    return going_on


def keep_tokenizer(tokenizer_path: str | None, run_dir: str):
    """Copies the run's tokenizer file (when it has one) into the run directory."""
    if tokenizer_path:
        target = storage.join(run_dir, run_layout.TOKENIZER_FILE)
        if storage.absolute(tokenizer_path) == storage.absolute(target):
            return
        with locations.open_input(tokenizer_path) as f:
            storage.write_bytes(target, f.read())

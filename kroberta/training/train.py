"""Training a run: `kroberta.train(config)`, what `python -m kroberta.train` calls.

Trains (or resumes) the run a config describes: its data resolved, the run directory
checked and written, the model built and compiled, fit with logging, evaluation and
checkpoints, the final model saved. With no data configured it runs the embedded
default job: a small model on a corpus made
from the Python standard library's docstrings, a few minutes on a laptop CPU.
Re-running the same command resumes from the run directory's latest checkpoint.
"""

import dataclasses
import math
import time

from kroberta import storage
from kroberta.config import Config, ConfigError, parse_window, to_dict, to_toml, validate
from kroberta.training import checkpoint, signals, trackers
from kroberta.training.run_dir import (CHANGES_FILE, changed_settings, check_free_space,
                                       check_writable, describe_changes, record_changes,
                                       removed_unless_checkpointed, truncate_metrics)
from kroberta.training.preemption import PreemptionFlag

# JAX, Keras and TensorFlow are imported by the functions that use them, so that
# `--help`, config errors and `--explain` answer without their seconds of start-up.

_QUIET = False  # True on processes other than 0 of a multi-process job


def _log(message: str):
    if not _QUIET:
        print(message, flush=True)


def _prepare_run_dir(config: Config, force: bool, write: bool = True,
                     accept_changes: bool = False, log=None):
    """Creates the run dir and writes config.toml; refuses a run with another model, or
    with other training settings (`TRAINING_KEYS`) unless `accept_changes`;
    records every change of setting in config_changes.jsonl.

    Every process checks; only process 0 (`write`) changes the run directory.
    """
    from kroberta.training import final_model

    log = log or _log
    storage.makedirs(config.run_dir)
    path = storage.join(config.run_dir, final_model.CONFIG_FILE)
    saved = checkpoint.list_checkpoints(config.run_dir)
    changes = {}
    if storage.isfile(path) and saved:
        previous = final_model.load_run_config(config.run_dir)
        # A new start (initializer_range) is not a new model: the checkpoint holds its weights.
        before, now = previous.model.trained_model(), config.model.trained_model()
        other_model = before != now
        if other_model and not force:
            changed = [k for k in to_dict(config)["model"]
                       if getattr(before, k) != getattr(now, k)]
            raise ConfigError(
                f"run_dir: {config.run_dir} holds a run of a different model "
                f"(changed: {', '.join('model.' + k for k in changed)}); use another "
                "--run_dir, or --force (force=True) to start this model there from scratch"
            )
        training, other = changed_settings(to_dict(previous),
                                                       to_dict(config))
        starts_over = force and (other_model or training)
        if training and not force and not accept_changes:
            raise ConfigError(
                f"run_dir: {config.run_dir} holds a run trained with other settings "
                f"({describe_changes(training)}); use another --run_dir, --force (force=True) "
                "to start over there, or --accept-changes (accept_changes=True) to continue its "
                "checkpoint with "
                f"these settings (recorded in {CHANGES_FILE})")
        if not write:
            return
        if starts_over:
            storage.rmtree(storage.join(config.run_dir, checkpoint.CHECKPOINT_DIR))
            trackers.forget_runs(config.run_dir)  # a new start: new tracker runs
        else:
            changes = {**training, **other}
    if not write:
        return
    if changes:
        record_changes(config.run_dir, saved[-1][0], changes)
        log(f"run_dir: continuing step {saved[-1][0]} with changed settings: "
            f"{describe_changes(changes)} (recorded in {CHANGES_FILE})")
    storage.write_text(path, to_toml(config))


def _keep_tokenizer(tokenizer_path: str | None, run_dir: str):
    from kroberta.text import locations
    from kroberta.training import final_model

    if tokenizer_path:
        target = storage.join(run_dir, final_model.TOKENIZER_FILE)
        if storage.absolute(tokenizer_path) == storage.absolute(target):
            return
        with locations.open_binary(tokenizer_path) as f:  # a URL: read as the records are
            storage.write_bytes(target, f.read())


def train(config: Config, force: bool = False, until_step: int | None = None,
         sources: dict | None = None, accept_changes: bool = False) -> dict:
    """Trains (or resumes) the run described by `config`; returns a summary dict.

    `until_step` stops this invocation after that step (with a checkpoint there) while
    the schedule still spans `train.steps`; re-running continues the same run.
    A run directory with checkpoints resumes only with the same model and training
    settings: `force` starts over there, `accept_changes` continues the checkpoint with
    changed training settings (recorded in config_changes.jsonl, as every change is).

    Raises ConfigError / DataError for bad settings or data, before any compute; a run
    directory this call created is removed again when it fails before its first
    checkpoint (`removed_unless_checkpointed`).
    """
    config = validate(config, sources or "config")
    if until_step is not None and until_step < 1:
        raise ConfigError(f"until_step (--until-step) = {until_step}: give the step to stop "
                          f"after, 1 to train.steps ({config.train.steps})")
    with removed_unless_checkpointed(config.run_dir):
        return _train_run(config, force, until_step, accept_changes)


def _train_run(config: Config, force: bool, until_step: int | None, accept_changes: bool) -> dict:
    import jax

    from kroberta.data import pipeline
    from kroberta.parallel import distribute, startup
    from kroberta.perf import advisor, dispatch_size
    from kroberta.training import final_model
    from kroberta.training.run_data import run_data_for

    global _QUIET
    # Joins a multi-host job (if any) before anything starts a JAX backend.
    startup.initialize(config, log=_log)
    main_process = jax.process_index() == 0
    _QUIET = not main_process
    check_writable(config.run_dir)
    _check_before_data(config, main_process)
    run_data = run_data_for(config, log=_log)
    config, tokenizer_path = run_data.config, run_data.tokenizer_path
    train_spec = run_data.train
    _check_signals(config, run_data)
    _prepare_run_dir(config, force, write=main_process, accept_changes=accept_changes)
    if main_process:
        _keep_tokenizer(tokenizer_path, config.run_dir)
        checkpoint.clean_temporaries(config.run_dir)
    distribute.barrier("run_dir ready")  # the others read it (checkpoints) from here on

    topology = distribute.setup(config)
    global_batch = distribute.global_batch_size(config, topology)
    slots = config.data.prediction_slots(train_spec.sequence_length)
    config = dispatch_size.with_steps_per_execution(config, topology.devices, global_batch,
                                                    train_spec.sequence_length, log=_log)
    run_data = dataclasses.replace(run_data, config=config)  # K resolved for the pipelines too
    from kroberta.model.mlm import build_compiled_model, count_parameters

    model = build_compiled_model(config, run_data.word_starts)
    _log(f"devices: {topology.describe()}")
    _log(distribute.describe_memory(model, topology))
    from kroberta.model import attention

    _log(attention.describe(config))
    accumulation = config.train.gradient_accumulation_steps
    per_device = f"{config.train.batch_size_per_device} per device" + (
        f" x {accumulation} accumulated micro-batches" if accumulation > 1 else "")
    _log(f"model: {count_parameters(model):,} parameters; batch {global_batch} "
         f"({per_device}) x {train_spec.sequence_length} "
         f"tokens, {slots} prediction slots per sequence; {len(train_spec.files)} training file(s)")
    # TPU-alignment advice only where it applies; `--explain` shows it anywhere.
    for line in advisor.warnings_for(config, topology.platform, shapes=topology.platform == "tpu"):
        _log(f"warning: {line}")
    if config.data.masking == "static":
        over, dropped = pipeline.count_labels_beyond_slots(train_spec, slots,
                                                             config.model.vocabulary_size)
        if over:
            _log(f"warning: in a sample of the training data {over} sequence(s) have more than "
                 f"{slots} labels; {dropped} labels beyond the slots are not predicted. "
                 "Raise data.max_predictions to keep them.")
    if (capped := config.data.capped_masking(train_spec.sequence_length)) is not None:
        _log(f"warning: {capped}")

    check_free_space(config.run_dir, 2 * checkpoint.estimated_bytes(model),
                                 "a checkpoint (weights and optimizer state)")
    start_step = 0
    saved = checkpoint.list_checkpoints(config.run_dir)
    if saved:
        checkpoint.restore(model, saved[-1][1])
        start_step = int(model.optimizer.iterations.numpy())
        _log(f"resuming from {saved[-1][1]} (step {start_step})")
    elif config.init_from_hf:
        from kroberta.interop.hf import init_from_hf

        init_from_hf(model, config.init_from_hf)
        _log(f"initialised from the Hugging Face checkpoint in {config.init_from_hf}")
    elif config.init_from_keras_hub:
        from kroberta.interop.keras_hub_presets import init_from_keras_hub

        with_head = init_from_keras_hub(model, config.init_from_keras_hub)
        _log(f"initialised from the keras-hub preset in {config.init_from_keras_hub}"
             + ("" if with_head else " (backbone only: the MLM head starts fresh)"))
    dropped = truncate_metrics(config.run_dir, start_step) if main_process else 0
    if dropped:
        _log(f"metrics.jsonl: dropped {dropped} row(s) logged after step {start_step}, "
             "the checkpoint this run resumes from")
    summary = {"run_dir": config.run_dir, "start_step": start_step, "steps": config.train.steps,
               "devices": topology.num_devices, "global_batch": global_batch}
    stop_step = min(until_step or config.train.steps, config.train.steps)
    ended = signals.ended_early(config.run_dir, start_step, config.train) if saved else None
    if ended:
        _log(f"the run ended early at step {start_step} ({ended}); nothing to train. "
             "Change the setting that ended it (train.early_stop_patience, "
             "train.target_eval_loss) to train on")
        summary["stopped_early"] = ended
        stop_step = start_step
    model_file = storage.join(config.run_dir, final_model.WEIGHTS_FILE)
    if start_step < stop_step and main_process and storage.isfile(model_file):
        # A finished run trained on (--accept-changes): its model file would outlive the
        # newer checkpoints, and kroberta.load reads it first. The checkpoint resumed from
        # (written at the run's last step) holds the same weights.
        storage.remove(model_file)
        _log(f"{final_model.WEIGHTS_FILE} of step {start_step} removed: the run trains on "
             f"(the checkpoint at step {start_step} holds the same weights)")
    if start_step < stop_step:
        try:
            summary.update(_fit(model, run_data, topology, start_step, stop_step))
        except KeyboardInterrupt:
            # A second Ctrl-C (the first one checkpoints: PreemptionFlag), or a Ctrl-C in a
            # multi-process job: the checkpoints on disk are complete (each is renamed into
            # place only once written), so the run resumes.
            _log_interrupted(config.run_dir)
            raise
    summary["final_step"] = int(model.optimizer.iterations.numpy())
    trained_nothing = summary["final_step"] == start_step
    if trained_nothing and (ended or start_step >= config.train.steps) \
            and storage.isfile(model_file):
        if not ended:
            _log(f"the run finished at step {start_step}; its model is in {config.run_dir}. "
                 "Nothing to train (raise train.steps with --accept-changes, "
                 "accept_changes=True in Python, to train on)")
        return summary
    if summary.get("stopped_early") and not ended:
        _log(f"early stop at step {summary['final_step']} of {config.train.steps}: "
             f"{summary['stopped_early']}")
    if summary.get("interrupted"):
        _log(f"interrupted at step {summary['final_step']}: checkpoint written; run the same "
             "training again (python -m kroberta.train ... or kroberta.train(config)) to "
             "resume, or kroberta.load(run_dir) to use it")
        raise KeyboardInterrupt
    if summary.get("preempted"):
        # Every process says it: in a job the notice may have reached another host.
        who = f"process {jax.process_index()}: " if summary.get("job_wide") else ""
        print(f"{who}stopped by SIGTERM at step {summary['final_step']}: checkpoint written; "
              "re-run the same command to resume", flush=True)
        return summary
    if summary["final_step"] < config.train.steps and not summary.get("stopped_early"):
        # --until-step: the run is not over; kroberta.load reads its last checkpoint.
        _log(f"stopped at step {summary['final_step']} of {config.train.steps} (--until-step) "
             "with a checkpoint; run the same training again to go on")
        return summary
    final_model.save(model, config.run_dir)
    _log(f"model saved in {config.run_dir}")
    return summary


def _check_before_data(config: Config, main_process: bool):
    """Before the data are read or built: a missing tracker package, and a directory
    to initialise from that is not there."""
    if main_process:
        trackers.check_installed(config)
    for key, what in (("init_from_hf", "a Hugging Face model directory"),
                      ("init_from_keras_hub", "a keras-hub preset directory")):
        directory = getattr(config, key)
        if directory and not storage.isdir(directory):
            raise ConfigError(f"{key}: {directory!r} is not a directory (it should be {what})")


def _check_signals(config: Config, run_data):
    """Before any compute: the validation data that keep_best and the early stop need."""
    t = config.train
    if config.data.eval_mask_rate and config.data.masking == "static":  # "auto" became static
        raise ConfigError("data.eval_mask_rate: the files carry labels, so data.masking is "
                          "static and evaluation uses them; set data.masking = \"dynamic\" "
                          "or leave data.eval_mask_rate at 0")
    if run_data.validation is None:
        for key, on in (("keep_best", t.keep_best), ("early_stop_patience", t.early_stop_patience),
                        ("target_eval_loss", t.target_eval_loss)):
            if on:
                raise ConfigError(f"train.{key}: needs validation data (data.validation, or "
                                  "data.dir with a validation split)")


def _log_interrupted(run_dir: str):
    saved = checkpoint.list_checkpoints(run_dir)
    if not saved:
        _log("interrupted before the first checkpoint: nothing was kept; the same training "
             "starts over")
        return
    _log(f"interrupted: the checkpoint at step {saved[-1][0]} is kept; run the same training "
         "again (python -m kroberta.train ... or kroberta.train(config)) to resume, or "
         "kroberta.load(run_dir) to use it")


def _fit(model, run_data, topology, start_step, stop_step) -> dict:
    from kroberta.parallel import distribute
    from kroberta.training.run_callbacks import RunLogger
    from kroberta.training.run_data import train_batches, validation_batches

    config, train_spec, val_spec = run_data.config, run_data.train, run_data.validation
    t = config.train
    global_batch = distribute.global_batch_size(config, topology)
    # Each process reads its own share; Keras assembles the global batch from them.
    shard = distribute.data_shard(topology)
    process_batch = distribute.process_batch_size(config, topology)
    evaluate_fn = None
    if val_spec is not None:
        # Evaluation needs no gradients to accumulate: batches of one micro-batch.
        eval_ds = validation_batches(
            run_data, distribute.micro_batch_size(config, topology), shard=shard)

        def evaluate_fn():
            logs = model.evaluate(eval_ds, verbose=0, return_dict=True)
            # Token-weighted over the whole set (the padding examples weigh nothing).
            return {"loss": math.log(logs["perplexity"]),
                    "masked_accuracy": float(logs["masked_accuracy"]),
                    "perplexity": float(logs["perplexity"])}

    preemption = PreemptionFlag()
    logger = RunLogger(config, config.run_dir, start_step, global_batch,
                       train_spec.sequence_length, evaluate_fn, stop_step, preemption=preemption,
                       write_files=topology.is_main, save_checkpoints=True)
    callbacks = [logger]
    profile = _profile_window(config, start_step, topology.is_main)
    if profile is not None:
        callbacks.insert(0, profile)  # its interval end (a trace's end) before the evaluation

    def fit_segment(begin, end, interval):
        # One Keras epoch per log interval (kroberta.training.run_callbacks).
        # The data stream restarts exactly after `begin` batches (see data.train_dataset).
        # Exactly `end - begin` batches: fused dispatches take K of them at a time
        # (kroberta.model.super_batch), and a last group that ends at `end` takes the rest.
        train_ds = train_batches(run_data, process_batch, begin, shard=shard)
        model.fit(train_ds.take(end - begin), steps_per_epoch=interval,
                  epochs=math.ceil((end - begin) / interval), verbose=0,
                  callbacks=callbacks, shuffle=False)

    started = time.perf_counter()
    failed = True
    try:
        with preemption:
            step = start_step
            if step % t.log_every:
                # Resuming from a SIGTERM checkpoint between log boundaries: a short
                # interval first, so rows, evaluations and checkpoints stay on multiples.
                boundary = min(stop_step, (step // t.log_every + 1) * t.log_every)
                fit_segment(step, boundary, boundary - step)
                step = boundary
            if step < stop_step and not preemption.requested and not logger.stopped_early:
                fit_segment(step, stop_step, t.log_every)
        failed = False
    except Exception as error:  # tf.data errors surface here, mid-fit
        raise _named_data_error(error, config, train_spec, val_spec, start_step, logger.step,
                                process_batch, shard) from None
    finally:
        if profile is not None:
            profile.close()
        logger.close(failed)
    return {"seconds": time.perf_counter() - started, "compile_seconds": logger.compile_seconds,
            "preempted": preemption.requested and not preemption.interrupted,
            "interrupted": preemption.interrupted, "job_wide": preemption.job_wide,
            "stopped_early": logger.stopped_early}


def _profile_window(config, start_step: int, main_process: bool):
    """The `train.profile` callback (process 0 only), its window on dispatch boundaries."""
    from kroberta.training import profiling

    window = parse_window(config.train.profile)
    if window is None or not main_process:
        return None
    t = config.train
    aligned = profiling.aligned_window(window, t.steps_per_execution, t.steps)
    if aligned != window:
        _log(f"profile: steps {window[0]}:{window[1]} widened to {aligned[0]}:{aligned[1]}, "
             f"whole dispatches of train.steps_per_execution={t.steps_per_execution} steps")
    return profiling.ProfileWindow(config.run_dir, aligned, start_step, log=_log)


def _named_data_error(error, config, train_spec, val_spec, start_step, step, process_batch, shard):
    """The error to raise for a failure mid-fit: bad data named by file and record."""
    from kroberta.data import pipeline

    V = config.model.vocabulary_size
    # The batches up to the failing one (logged step, plus what tf.data had prefetched and
    # the rest of the group of batches parsed together).
    ahead = 64 + pipeline.batches_per_call(process_batch)
    train_replay = pipeline.replay_train_errors(
        train_spec, config.data, V, config.train.seed, start_step, step - start_step + ahead,
        process_batch, shard)
    replays = [train_replay]
    files = list(train_spec.files)
    if val_spec is not None:
        replays.append(pipeline.replay_file_errors(val_spec, V))
        files += val_spec.files
    explained = pipeline.explain_pipeline_error(
        error, files, replay=lambda: next(filter(None, (r() for r in replays)), None))
    return explained if explained is not None else error

"""Training a run: `kroberta.train(config)`, what `python -m kroberta.train` calls.

Trains (or resumes) the run a config describes: its data resolved, the run directory
checked and written, the model built and compiled, fit with logging, evaluation and
checkpoints, the final model saved. With no data configured it runs the embedded
default job: a small model on a corpus made
from the Python standard library's docstrings, a few minutes on a laptop CPU.
Re-running the same command resumes from the run directory's latest checkpoint.
"""

import dataclasses
import enum
import logging
import math
import numbers
import time

from kroberta import storage
from kroberta.config import Config, TrainConfig, parse_window, validate
from kroberta.data.file_patterns import DataSources, find_sources
from kroberta.errors import ConfigError
from kroberta.interop.checkpoint_config import checkpoint_directory
from kroberta.runtime import logs
from kroberta.training import checkpoint, final_model, signals, time_budget, trackers
from kroberta.training.preemption import PreemptionFlag
from kroberta.training.run_dir import (
    RunDirState,
    keep_tokenizer,
    prepare_run_dir,
    read_run_dir,
    removed_unless_checkpointed,
    resumed_history,
)

# JAX, Keras and TensorFlow are imported by the functions that use them, so that
# `--help`, config errors and `--explain` answer without their seconds of start-up.

logger = logging.getLogger(__name__)


class Outcome(enum.Enum):
    """How an invocation of `train` ended (decided by `_outcome`)."""

    FINISHED = "finished"  # trained to train.steps: the final model saved
    STOPPED_EARLY = "stopped early"  # train.early_stop_patience / target_eval_loss: model saved
    UNTIL_STEP = "stopped at --until-step"  # a checkpoint; the run is not over
    PREEMPTED = "preempted"  # SIGTERM: a checkpoint; re-run to resume (exit 143)
    INTERRUPTED = "interrupted"  # Ctrl-C: a checkpoint; KeyboardInterrupt raised
    NOTHING_TO_DO = "nothing to do"  # the run had finished or ended early before: no writes


@dataclasses.dataclass
class _Run:
    """What the set-up resolved: the run directory, the data, the plan, the model."""

    run_dir: RunDirState  # as the run goes on from it (no checkpoints when it starts over)
    run_data: object  # kroberta.training.run_data.RunData
    plan: object  # kroberta.perf.plan.Plan: the config, devices, batches, steps per dispatch, slots
    model: object  # the compiled masked-LM

    @property
    def config(self) -> Config:
        return self.plan.config

    @property
    def main_process(self) -> bool:
        """Process 0 (the only one in a single-process run)."""
        return self.plan.topology.is_main


def train(
    config: Config,
    force: bool = False,
    until_step: int | None = None,
    sources: dict | None = None,
    accept_changes: bool = False,
) -> dict:
    """Trains (or resumes) the run described by `config`; returns a summary dict.

    `until_step` stops this invocation after that step (with a checkpoint there) while
    the schedule still spans `train.steps`; re-running continues the same run.
    A run directory with checkpoints resumes only with the same model and training
    settings: `force` starts over there, `accept_changes` continues the checkpoint with
    changed training settings (recorded in config_changes.jsonl, as every change is).

    Returns:
        {"run_dir", "start_step", "final_step", "steps", "devices", "global_batch",
        "outcome" (an `Outcome`), "stopped_early" (why, when it did), and when it
        trained "seconds", "compile_seconds", "preempted", "interrupted", "job_wide"}.

    Raises ConfigError / InputError for bad settings or data, before any compute; a run
    directory this call created is removed again when it fails before its first
    checkpoint (`removed_unless_checkpointed`). KeyboardInterrupt after a Ctrl-C, once
    the checkpoint it asked for is written.
    """
    started = time.perf_counter()  # train.time_budget counts from here
    logs.show_messages()
    config = validate(config, sources or "config")
    if until_step is not None and (
        not isinstance(until_step, numbers.Integral)
        or isinstance(until_step, bool)
        or until_step < 1
    ):
        raise ConfigError(
            f"until_step (--until-step) = {until_step!r}: give the step to stop "
            f"after, 1 to train.steps ({config.train.steps})"
        )
    run_dir = read_run_dir(config.run_dir)  # the one look at what it holds
    # A budget's steps: recorded by the run to resume, or measured once the model can run.
    config, measure = time_budget.resolve(config, None if force else run_dir.recorded)
    with removed_unless_checkpointed(run_dir):
        run = _set_up(config, run_dir, force, accept_changes, started if measure else None)
        start_step = _restore_or_initialise(run)
        history = resumed_history(run.config.run_dir, start_step, write=run.main_process)
        summary = {
            "run_dir": run.config.run_dir,
            "start_step": start_step,
            "steps": run.config.train.steps,
            "devices": run.plan.topology.num_devices,
            "global_batch": run.plan.global_batch,
        }
        ended = signals.ended_early(history, start_step, run.config.train)
        stop_step = (
            start_step
            if ended
            else min(until_step or run.config.train.steps, run.config.train.steps)
        )
        if ended:
            logger.info(
                f"the run ended early at step {start_step} ({ended}); nothing to train. "
                "Change the setting that ended it (train.early_stop_patience, "
                "train.target_eval_loss) to train on"
            )
            summary["stopped_early"] = ended
        if start_step < stop_step:
            _remove_stale_model(run, start_step)
            try:
                summary.update(_fit(run, start_step, stop_step, history))
            except KeyboardInterrupt:
                # A second Ctrl-C (the first one checkpoints: PreemptionFlag), or a Ctrl-C in
                # a multi-process job: the checkpoints on disk are complete (each is renamed
                # into place only once written), so the run resumes.
                _log_interrupted(run.config.run_dir)
                raise
        summary["final_step"] = int(run.model.optimizer.iterations.numpy())
        summary["outcome"] = _outcome(run, summary, ended)
        _finish(run, summary, ended)
        return summary


def _set_up(
    config: Config,
    run_dir: RunDirState,
    force: bool,
    accept_changes: bool,
    budget_started: float | None = None,
) -> _Run:
    """Joins the job, resolves the data, checks and writes the run directory (`run_dir`:
    what it held), fixes the steps of a time budget (`budget_started`: when the budget
    began; None: the steps are known), builds the model; says what it built."""
    sources = _check_paths(config)  # before JAX and TensorFlow start: a wrong path at once
    # start-up: JAX, the model and the data load once the paths were checked
    import jax

    from kroberta.model.mlm import build_compiled_model
    from kroberta.parallel import distribute, startup
    from kroberta.perf.plan import make_plan
    from kroberta.training.run_data import run_data_for

    startup.initialize(config.distributed)  # a multi-host job, before any JAX backend starts
    main_process = jax.process_index() == 0
    if main_process:
        trackers.check_installed(config.train.trackers)  # before the data are read or built
    run_data = run_data_for(config, sources)
    config = run_data.config
    _check_signals(config.train, has_validation=run_data.validation is not None)
    topology = distribute.setup(config.distributed, config.model)
    plan = make_plan(config, topology=topology, sequence_length=run_data.train.sequence_length)
    if budget_started is not None:  # the run directory refused before measuring, if it must be
        prepare_run_dir(config, run_dir, force, accept_changes, write=False)
        config = time_budget.fix_steps(config, run_data, plan, budget_started)
        plan = make_plan(config, topology=topology, sequence_length=run_data.train.sequence_length)
    with storage.writing(config.run_dir, "run directory's config and tokenizer"):
        going_on = prepare_run_dir(config, run_dir, force, accept_changes, write=main_process)
        if main_process:
            keep_tokenizer(run_data.tokenizer_path, config.run_dir)
            checkpoint.clean_temporaries(config.run_dir)
    distribute.barrier("run_dir ready")  # the others read it (checkpoints) from here on
    if plan.auto_steps:
        logger.info(
            f"steps per dispatch: {plan.steps_per_dispatch} "
            f'(train.steps_per_execution="auto": {plan.steps_reason})'
        )
    config = plan.config
    run_data = dataclasses.replace(run_data, config=config)  # K resolved for the pipelines too
    run = _Run(going_on, run_data, plan, build_compiled_model(config, run_data.word_starts))
    _describe(run)
    storage.check_room(
        config.run_dir,
        2 * checkpoint.estimated_bytes(run.model),
        "a checkpoint (weights and optimizer state)",
        key="run_dir",
    )
    return run


def _check_paths(config: Config) -> DataSources:
    """Every path the run names, checked once: the run directory can be written, the
    directory to initialise from is there, and the data are found (a prepared
    directory's manifest read, files and globs matched), for `run_data_for` to read with
    TensorFlow."""
    storage.check_writable(config.run_dir, "run_dir", folder=True)
    checkpoint_directory(config)
    return find_sources(config.data)


def _describe(run: _Run):
    """The devices, memory, attention, model and batch, and the advice that applies."""
    # start-up: see the note at the top
    from kroberta.data import pipeline
    from kroberta.model import attention
    from kroberta.model.mlm import count_parameters
    from kroberta.parallel import distribute
    from kroberta.perf import advisor

    config, train_spec, topology = run.config, run.run_data.train, run.plan.topology
    slots = run.plan.slots
    logger.info(f"devices: {topology.describe()}")
    logger.info(distribute.describe_memory(run.model, topology))
    logger.info(attention.describe(config.model, config.train.mixed_precision, config.train.remat))
    accumulation = config.train.gradient_accumulation_steps
    per_device = f"{config.train.batch_size_per_device} per device" + (
        f" x {accumulation} accumulated micro-batches" if accumulation > 1 else ""
    )
    logger.info(
        f"model: {count_parameters(run.model):,} parameters; batch {run.plan.global_batch} "
        f"({per_device}) x {train_spec.sequence_length} tokens, {slots} prediction "
        f"slots per sequence; {len(train_spec.files)} training file(s)"
    )
    t = config.train
    fraction = f" (train.warmup_fraction={t.warmup_fraction:g})" if t.warmup_fraction else ""
    logger.info(
        f"schedule: warmup over {t.effective_warmup_steps()} of {t.steps} steps{fraction} to "
        f"learning rate {t.learning_rate:g}, then {t.schedule}"
    )
    # TPU-alignment advice only where it applies; `--explain` shows it anywhere.
    for line in advisor.warnings_for(config, topology.platform, shapes=topology.platform == "tpu"):
        logger.warning(f"warning: {line}")
    if config.data.masking == "static":
        over, dropped = pipeline.count_labels_beyond_slots(
            train_spec, slots, config.model.vocabulary_size
        )
        if over:
            logger.warning(
                f"warning: in a sample of the training data {over} sequence(s) have "
                f"more than {slots} labels; {dropped} labels beyond the slots are not "
                "predicted. Raise data.max_predictions to keep them."
            )
    if (capped := config.data.capped_masking(train_spec.sequence_length)) is not None:
        logger.warning(f"warning: {capped}")


def _restore_or_initialise(run: _Run) -> int:
    """The weights to start from: the run's latest checkpoint, else config.init_from_hf /
    init_from_keras_hub, else the fresh ones. Returns the step it starts from."""
    config, start_step = run.config, 0
    saved = run.run_dir.checkpoints
    if saved:
        checkpoint.restore(run.model, saved[-1][1])
        start_step = int(run.model.optimizer.iterations.numpy())
        logger.info(f"resuming from {saved[-1][1]} (step {start_step})")
    elif config.init_from_hf:
        # start-up: the Hugging Face reader loads for an init_from_hf run only
        from kroberta.interop.hf import init_from_hf

        init_from_hf(run.model, config.init_from_hf)
        logger.info(f"initialised from the Hugging Face checkpoint in {config.init_from_hf}")
    elif config.init_from_keras_hub:
        # start-up: the keras-hub reader loads for an init_from_keras_hub run only
        from kroberta.interop.keras_hub_presets import init_from_keras_hub

        with_head = init_from_keras_hub(run.model, config.init_from_keras_hub)
        logger.info(
            f"initialised from the keras-hub preset in {config.init_from_keras_hub}"
            + ("" if with_head else " (backbone only: the MLM head starts fresh)")
        )
    return start_step


def _remove_stale_model(run: _Run, start_step: int):
    """A finished run trained on (--accept-changes): its model file would outlive the
    newer checkpoints, and kroberta.load reads it first. The checkpoint resumed from
    (written at the run's last step) holds the same weights."""
    if run.main_process and run.run_dir.model:
        storage.remove(run.run_dir.model)
        logger.info(
            f"{final_model.WEIGHTS_FILE} of step {start_step} removed: the run trains "
            f"on (the checkpoint at step {start_step} holds the same weights)"
        )


def _outcome(run: _Run, summary: dict, ended: str | None) -> Outcome:
    """The one place that decides how this invocation ended."""
    steps = run.config.train.steps
    start_step, final_step = summary["start_step"], summary["final_step"]
    if final_step == start_step and (ended or start_step >= steps) and run.run_dir.model:
        return Outcome.NOTHING_TO_DO
    if summary.get("interrupted"):
        return Outcome.INTERRUPTED
    if summary.get("preempted"):
        return Outcome.PREEMPTED
    if summary.get("stopped_early"):
        return Outcome.STOPPED_EARLY
    if final_step < steps:
        return Outcome.UNTIL_STEP
    return Outcome.FINISHED


def _finish(run: _Run, summary: dict, ended: str | None):
    """Says how the invocation ended and saves the final model of a run that is over;
    raises KeyboardInterrupt after a Ctrl-C."""
    # start-up: see the note at the top
    import jax

    outcome, step, steps = summary["outcome"], summary["final_step"], run.config.train.steps
    if outcome is Outcome.NOTHING_TO_DO:
        if not ended:  # an ended run said so before
            logger.info(
                f"the run finished at step {step}; its model is in {run.config.run_dir}. "
                "Nothing to train (raise train.steps with --accept-changes, "
                "accept_changes=True in Python, to train on)"
            )
    elif outcome is Outcome.INTERRUPTED:
        logger.info(
            f"interrupted at step {step}: checkpoint written; run the same training "
            "again (python -m kroberta.train ... or kroberta.train(config)) to resume, "
            "or kroberta.load(run_dir) to use it"
        )
        raise KeyboardInterrupt
    elif outcome is Outcome.PREEMPTED:
        # Every process says it (a warning): in a job the notice may have reached another host.
        who = f"process {jax.process_index()}: " if summary.get("job_wide") else ""
        logger.warning(
            f"{who}stopped by SIGTERM at step {step}: checkpoint written; re-run the "
            "same command to resume"
        )
    elif outcome is Outcome.UNTIL_STEP:
        # The run is not over; kroberta.load reads its last checkpoint.
        logger.info(
            f"stopped at step {step} of {steps} (--until-step) with a checkpoint; run "
            "the same training again to go on"
        )
    else:
        if outcome is Outcome.STOPPED_EARLY and not ended:
            logger.info(f"early stop at step {step} of {steps}: {summary['stopped_early']}")
        model_file = storage.join(run.config.run_dir, final_model.WEIGHTS_FILE)
        with storage.writing(
            model_file,
            "final model",
            f"the checkpoint at step {step} is "
            "kept; free some space and run the same training again to save it",
        ):
            # The run directory holds the run's config (written by _set_up): weights alone.
            final_model.save_run_weights(run.model, run.config.run_dir)
        logger.info(f"model saved in {run.config.run_dir}")


def _check_signals(t: TrainConfig, has_validation: bool):
    """Before any compute: the validation data that keep_best and the early stop need."""
    if not has_validation:
        for key, on in (
            ("keep_best", t.keep_best),
            ("early_stop_patience", t.early_stop_patience),
            ("target_eval_loss", t.target_eval_loss),
        ):
            if on:
                raise ConfigError(
                    f"train.{key}: needs validation data (data.validation, or "
                    "data.dir with a validation split)"
                )


def _log_interrupted(run_dir: str):
    saved = checkpoint.list_checkpoints(run_dir)
    if not saved:
        logger.info(
            "interrupted before the first checkpoint: nothing was kept; the same "
            "training starts over"
        )
        return
    logger.info(
        f"interrupted: the checkpoint at step {saved[-1][0]} is kept; run the same "
        "training again (python -m kroberta.train ... or kroberta.train(config)) to "
        "resume, or kroberta.load(run_dir) to use it"
    )


def _fit(run: _Run, start_step: int, stop_step: int, history: list[dict]) -> dict:
    # Start-up: loaded when training starts (see the note at the top).
    from kroberta.training.run_data import train_batches

    model, t = run.model, run.config.train
    preemption = PreemptionFlag()
    run_logger, profile = _callbacks(run, start_step, stop_step, preemption, history)
    callbacks = [run_logger] if profile is None else [profile, run_logger]
    # (a profile's interval end, a trace's end, comes before the evaluation)

    def fit_segment(begin, end, interval):
        # One Keras epoch per log interval (kroberta.training.run_callbacks).
        # The data stream restarts exactly after `begin` batches (see data.train_dataset).
        # Exactly `end - begin` batches: fused dispatches take K of them at a time
        # (kroberta.model.super_batch), and a last group that ends at `end` takes the rest.
        train_ds = train_batches(
            run.run_data, run.plan.process_batch, begin, shard=run.plan.data_shard
        )
        model.fit(
            train_ds.take(end - begin),
            steps_per_epoch=interval,
            epochs=math.ceil((end - begin) / interval),
            verbose=0,
            callbacks=callbacks,
            shuffle=False,
        )

    started = time.perf_counter()
    failed = True
    try:
        with preemption:
            if start_step == 0 and (run.config.init_from_hf or run.config.init_from_keras_hub):
                run_logger.evaluate_at_start()  # the checkpoint's own loss, to improve on
            step = start_step
            if step % t.log_every:
                # Resuming from a SIGTERM checkpoint between log boundaries: a short
                # interval first, so rows, evaluations and checkpoints stay on multiples.
                boundary = min(stop_step, (step // t.log_every + 1) * t.log_every)
                fit_segment(step, boundary, boundary - step)
                step = boundary
            if step < stop_step and not preemption.requested and not run_logger.stopped_early:
                fit_segment(step, stop_step, t.log_every)
        failed = False
    except Exception as error:  # tf.data errors surface here, mid-fit
        raise _named_data_error(error, run, start_step, run_logger.step) from None
    finally:
        if profile is not None:
            profile.close()
        run_logger.close(failed)
    return {
        "seconds": time.perf_counter() - started,
        "compile_seconds": run_logger.compile_seconds,
        "preempted": preemption.requested and not preemption.interrupted,
        "interrupted": preemption.interrupted,
        "job_wide": preemption.job_wide,
        "stopped_early": run_logger.stopped_early,
    }


def _callbacks(
    run: _Run, start_step: int, stop_step: int, preemption: PreemptionFlag, history: list[dict]
):
    """The run's logger (rows, evaluations, checkpoints, the probe), going on from the
    metrics rows of `history`, and its profile window (None when it has none)."""
    # Start-up: loaded when training starts (see the note at the top).
    from kroberta.pretraining import probe
    from kroberta.training.evaluation import validation_row
    from kroberta.training.run_callbacks import RunLogger
    from kroberta.training.run_data import validation_batches

    model, run_data, plan, config = run.model, run.run_data, run.plan, run.config
    evaluate = None
    if run_data.validation is not None:
        # Evaluation needs no gradients to accumulate: batches of one micro-batch.
        # Each process reads its own share; Keras assembles the global batch from them.
        eval_ds = validation_batches(run_data, plan.micro_batch, shard=plan.data_shard)

        def evaluate():
            return validation_row(model.evaluate(eval_ds, verbose=0, return_dict=True))

    # train.downstream's task, read and tokenised once, before anything opens.
    probe_task = probe.for_run(config, run_data.train.sequence_length)
    run_logger = RunLogger(
        config,
        start_step,
        plan.global_batch,
        run_data.train.sequence_length,
        evaluate,
        stop_step,
        preemption=preemption,
        write_files=run.main_process,
        plan=plan,
        probe=probe_task,
        history=history,
    )
    run_logger.set_model(model)  # fit sets it too; the evaluation at the start needs it first
    return run_logger, _profile_window(config.train, config.run_dir, start_step, run.main_process)


def _profile_window(t: TrainConfig, run_dir: str, start_step: int, main_process: bool):
    """The `train.profile` callback (process 0 only), its window on dispatch boundaries,
    writing into `run_dir`."""
    # start-up: Keras' profiler callback loads for a profiled run only
    from kroberta.training import profiling

    window = parse_window(t.profile)
    if window is None or not main_process:
        return None
    aligned = profiling.aligned_window(window, t.steps_per_execution, t.steps)
    if aligned != window:
        logger.info(
            f"profile: steps {window[0]}:{window[1]} widened to {aligned[0]}:"
            f"{aligned[1]}, whole dispatches of train.steps_per_execution="
            f"{t.steps_per_execution} steps"
        )
    return profiling.ProfileWindow(run_dir, aligned, start_step)


def _named_data_error(error, run: _Run, start_step: int, step: int):
    """The error to raise for a failure mid-fit: bad data named by file and record."""
    # start-up: TensorFlow's pipeline loads only to name a bad record
    from kroberta.data import pipeline

    config, train_spec, val_spec = run.config, run.run_data.train, run.run_data.validation
    V, process_batch = config.model.vocabulary_size, run.plan.process_batch
    # The batches up to the failing one (logged step, plus what tf.data had prefetched and
    # the rest of the group of batches parsed together).
    ahead = 64 + pipeline.batches_per_call(process_batch)
    replays = [
        pipeline.replay_train_errors(
            train_spec,
            config.data,
            V,
            config.train.seed,
            start_step,
            step - start_step + ahead,
            process_batch,
            run.plan.data_shard,
        )
    ]
    files = list(train_spec.files)
    if val_spec is not None:
        replays.append(pipeline.replay_file_errors(val_spec, V))
        files += val_spec.files
    explained = pipeline.explain_pipeline_error(
        error, files, replay=lambda: next(filter(None, (r() for r in replays)), None)
    )
    return explained if explained is not None else error

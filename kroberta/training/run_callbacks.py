"""The Keras callback that logs, evaluates and checkpoints a training run.

`fit` runs one Keras epoch per log interval (`train.log_every` steps over the same
data iterator; kroberta's own word "epoch" means a pass over the training data), so
at the end of each (Keras' `on_epoch_end`) the interval's metrics are complete and the
device state has just been synced to the host: logging, evaluation and
checkpoints cost no extra host-device synchronisation. Steps run K at a time
(`train.steps_per_execution`, one compiled dispatch each, `kroberta.model.super_batch`):
the callback sees one batch per dispatch, numbered in single steps, and every
interval is a multiple of K, so its rows, evaluations and checkpoints fall between
dispatches; `step_time` is the interval's time per optimizer step, without the time
JAX spent compiling in it (`kroberta.training.compile_clock`; a row whose interval
compiled reports that time as `compile_seconds`).

Between log lines a terminal or notebook bar follows the dispatched steps at most
every `REDRAW_SECONDS` (host-side counts, no device sync); the first dispatch's
compilation is announced as soon as it ends.
"""

import json
import logging
import math
import time

import jax
import keras
import numpy as np

from kroberta import console, storage
from kroberta.errors import DivergedError
from kroberta.model.mlm import build_model
from kroberta.perf import flops, throughput
from kroberta.perf.plan import make_plan
from kroberta.training import checkpoint, signals, trackers
from kroberta.training.compile_clock import CompileClock
from kroberta.training.run_dir import (
    METRICS_FILE,
    PROBE_PREFIX,
    RANDOM_INIT,
    is_probe_reference,
)

REDRAW_SECONDS = 1.0  # a live bar's position between log intervals

logger = logging.getLogger(__name__)


class RunLogger(keras.callbacks.Callback):
    """metrics.jsonl, the trackers, a console line per interval, evals and checkpoints.

    Every row also goes to the trackers of `train.trackers` (process 0). After each
    evaluation `signals.EvalWatch` decides the best checkpoint (kept beside the newest
    ones with `train.keep_best`) and whether the run ends early (`stopped_early`).
    With `probe` (`train.downstream`'s task, read by the caller), a linear probe's scores
    follow each checkpoint (`_probe`), and once per run the same probe on a random
    initialisation of the run's shape: the line pretraining must beat (`kroberta.report`
    names the step where it does).
    """

    def __init__(
        self,
        config,
        start_step,
        global_batch,
        sequence_length,
        evaluate_fn,
        stop_step=None,
        write_files=True,
        preemption=None,
        save_checkpoints=True,
        plan=None,
        probe=None,
        history=(),
    ):
        super().__init__()
        self.config = config
        self.plan = plan  # kroberta.perf.plan.Plan of the run (None: made from config when needed)
        self.step = start_step
        self.global_batch = global_batch
        self.sequence_length = sequence_length
        self.evaluate_fn = evaluate_fn  # () -> dict of validation metrics, or None
        # A `kroberta.pretraining.probe.ProbeTask` (its `name`, `predictions(model)`,
        # `scores(predictions)` and `gaps(predictions, reference)`), read once per run
        # before anything opens; or None.
        self._probe_task = probe
        self.write_files = write_files  # False on processes other than 0: no files, no lines
        # Checkpoints are collectives: in a multi-process run every process saves.
        self.checkpoints = (
            checkpoint.Writer(
                config.run_dir, config.train.keep_checkpoints, config.train.async_checkpoints
            )
            if save_checkpoints
            else None
        )
        self.preemption = preemption  # a PreemptionFlag: SIGTERM asks for checkpoint + stop
        # Where this invocation stops: the end of the run, or earlier (--until-step).
        self.stop_step = min(stop_step or config.train.steps, config.train.steps)
        self.compile_seconds = None  # the first dispatch's compilation
        self._compile_clock = CompileClock().__enter__()  # left in `close`
        self._first_dispatch = True
        self._last_redraw = 0.0
        # A live bar in a terminal or a notebook; plain lines in a log file (None).
        self._progbar = (
            console.live_progress(config.train.steps, start_step) if write_files else None
        )
        # `history`: the run's metrics rows up to start_step (`run_dir.resumed_history`).
        self.watch = signals.EvalWatch(config.train, signals.validation_losses(history))
        self._evaluated_at_start = any(
            r["step"] == start_step and r.get("split") == "validation" for r in history
        )
        # Once per run: a resumed run finds the reference in its rows.
        self._reference_due = self._probe_task is not None and not any(
            is_probe_reference(r.get("split", "")) for r in history
        )
        self._reference = None  # {split: predictions} of the random initialisation's probe
        self.stopped_early = None  # why the run ended before stop_step, or None
        if self.checkpoints is not None and config.train.keep_best:
            self.checkpoints.protected_step = self.watch.best_step
        self._trackers = []
        if write_files:
            # Appended per row; on a URL (no append) rewritten whole per row.
            self._jsonl = storage.Appender(storage.join(config.run_dir, METRICS_FILE))
            self._trackers = trackers.open_trackers(config, config.run_dir)

    def on_epoch_begin(self, epoch, logs=None):
        self._interval_start_step = self.step
        # The previous interval's end synced with the devices: time from here is this
        # interval's alone (evaluation and checkpoint time excluded).
        self._interval_start = time.perf_counter()
        self._interval_compile = self._compile_clock.seconds

    # Everything per step happens in on_train_batch_begin: a callback that overrides
    # on_train_batch_end makes Keras convert every step's logs to numpy, a host-device
    # sync per step. Here nothing waits for the devices between log intervals.
    def on_train_batch_begin(self, batch, logs=None):
        if self._first_dispatch:
            self._first_dispatch = False
        elif self.compile_seconds is None:
            # The first dispatch traced and compiled synchronously (its execution is async).
            self.compile_seconds = self._compile_clock.seconds
            self._say(
                f"compiled the training step in {self.compile_seconds:.1f} s; a log line "
                f"every {self.config.train.log_every} steps"
            )
        step = self._interval_start_step + batch
        if self._progbar and time.perf_counter() - self._last_redraw >= REDRAW_SECONDS:
            self._last_redraw = time.perf_counter()
            self._progbar.update(step, self._progbar.values)  # dispatched, not yet synced
        # fit checks stop_training after this step: it is the last one when it reaches
        # the stop step, or when SIGTERM arrived.
        last = step + self.config.train.steps_per_execution
        preempted = self.preemption.poll() if self.preemption else False  # every dispatch
        if last >= self.stop_step or preempted:
            self.model.stop_training = True

    def on_epoch_end(self, epoch, logs=None):
        # fit has synced the state: the optimizer's counter is the true step.
        self.step = int(self.model.optimizer.iterations.numpy())
        steps_done = self.step - self._interval_start_step
        compiled = self._compile_clock.seconds - self._interval_compile
        if self.compile_seconds is None:  # the interval was a single dispatch
            self.compile_seconds = self._compile_clock.seconds
        seconds = max(time.perf_counter() - self._interval_start - compiled, 1e-9)
        samples_per_second = steps_done * self.global_batch / seconds if steps_done > 0 else None
        # The schedule's value at the step the next update will use.
        learning_rate = float(np.asarray(self.model.optimizer.learning_rate))
        row = {
            "step": self.step,
            "split": "train",
            # Token-weighted over every step of the interval: the Perplexity metric holds
            # sum(ce) / sum(masked tokens) since the interval began (Keras' "loss" is the
            # unweighted mean of per-step means).
            "loss": math.log(float(logs["perplexity"])),
            "masked_accuracy": float(logs["masked_accuracy"]),
            "perplexity": float(logs["perplexity"]),
            "learning_rate": learning_rate,
            "samples_per_second": samples_per_second,
            "tokens_per_second": samples_per_second * self.sequence_length
            if samples_per_second
            else None,
            **self._speed(samples_per_second),
        }
        # Whatever else the step logs flows through as it is: e.g. grad_norm, the mean over
        # the interval's optimizer steps of the gradient's global L2 norm before clipping
        # (kroberta.model.masked_lm).
        row.update(
            {
                key: float(value)
                for key, value in (logs or {}).items()
                if key not in row and key != "loss" and _is_number(value)
            }
        )
        if compiled > 0:
            row["compile_seconds"] = compiled  # kept out of samples_per_second
        self._emit(row)
        self._check_finite(row)
        t = self.config.train
        preempted = bool(self.preemption and self.preemption.requested)
        finished = self.step >= self.stop_step or preempted
        evaluate = (
            not preempted
            and self.evaluate_fn
            and ((t.eval_every and self.step % t.eval_every == 0) or self.step >= t.steps)
        )
        # The checkpoint before the evaluation: a run that dies in the evaluation (or
        # right after its last step) still leaves its checkpoint. With keep_best every
        # evaluated step has one: it may be the best.
        saved = (
            (t.checkpoint_every and self.step % t.checkpoint_every == 0)
            or finished
            or (evaluate and t.keep_best)
        )
        if saved:
            self._save_checkpoint()
        if preempted:
            # The request may have come after the interval's last dispatch (its poll said
            # no): fit must not start another interval.
            self.model.stop_training = True
        if evaluate:
            metrics = self.evaluate_fn()
            self._emit({"step": self.step, "split": "validation", **metrics})
            self._judge(metrics["loss"], saved)
        if saved and not preempted:  # SIGTERM's grace is for the checkpoint alone
            self._probe()

    def evaluate_at_start(self):
        """The validation row (and the probe's) at the start step, before the first
        training step: a run that starts from a checkpoint logs the loss the training
        improves on. Not a signal for the best checkpoint or the early stop
        (`signals.validation_losses`); written once (a run that starts over at step 0
        keeps the row it has). Needs the model (`set_model`)."""
        if self.evaluate_fn is None or self._evaluated_at_start:
            return
        self._emit({"step": self.step, "split": "validation", **self.evaluate_fn()})
        self._probe()
        self._compile_clock.seconds = 0.0  # the evaluation's compilation is no training step's

    def _probe(self):
        """A row per evaluated split of the linear probe on the model as it is now:
        "downstream/<task>" (with "/<split>" when the task has several), its metrics and
        how far its main metric is above the random initialisation's on the same texts,
        with a bootstrap interval (`ProbeTask.gaps`). Prediction only: the training state and
        its random streams are not touched."""
        task = self._probe_task
        if task is None:
            return
        if self._reference is None:
            # The random initialisation's predictions, once per invocation (a resumed run
            # predicts them again: the same model from the same seed); its row once per run.
            started = time.perf_counter()
            self._reference = task.predictions(self._random_init())
            if self._reference_due:
                self._reference_due = False
                self._emit_probe(
                    task.scores(self._reference),
                    time.perf_counter() - started,
                    suffix=f"/{RANDOM_INIT}",
                )
        started = time.perf_counter()
        predicted = task.predictions(self.model)
        results, gaps = task.scores(predicted), task.gaps(predicted, self._reference)
        self._emit_probe(
            {split: {**values, **gaps[split]} for split, values in results.items()},
            time.perf_counter() - started,
        )

    def _emit_probe(self, results: dict, seconds: float, suffix: str = ""):
        for split, values in results.items():
            where = "" if len(results) == 1 else f"/{split}"
            self._emit(
                {
                    "step": self.step,
                    "split": f"{PROBE_PREFIX}{self._probe_task.name}{where}{suffix}",
                    **values,
                    "seconds": seconds,
                }
            )

    def _random_init(self):
        """A model of the run's shape as training would start it from `train.seed`
        (a run from step 0 probes its own start), built apart from the trained one."""
        return build_model(self.config.model, seed=self.config.train.seed, config=self.config)

    def _save_checkpoint(self):
        if self.checkpoints is not None:
            blocked = self.checkpoints.save(self.model, self.step)
            self._emit(
                {"step": self.step, "split": "checkpoint", "checkpoint_blocked_seconds": blocked}
            )

    def _judge(self, loss: float, saved: bool):
        """The best checkpoint and the early stop, after the evaluation at this step."""
        reason = self.watch.record(self.step, loss)
        if self.checkpoints is not None and self.config.train.keep_best:
            self.checkpoints.protected_step = self.watch.best_step
        if reason is None or self.step >= self.stop_step:
            return
        self.stopped_early = reason
        self.model.stop_training = True
        if not saved:  # a re-run must find the run ended here, not resume before it
            self._save_checkpoint()
        self._emit({"step": self.step, "split": signals.EARLY_STOP, "reason": reason})

    def _speed(self, samples_per_second):
        """step_time (s) and mfu (model FLOP/s over the devices' peak; kroberta.perf.throughput)."""
        if not samples_per_second:
            return {}

        if not hasattr(self, "_peak"):
            plan = self.plan or make_plan(self.config, sequence_length=self.sequence_length)
            devices = plan.topology.devices
            self._peak = throughput.peak_flops(devices)
            self._cpu = devices[0].platform == "cpu"
            # Re-measured below only in a single process (the measurement uses every device).
            self._remeasure = self._cpu and jax.process_count() == 1
        shape = flops.Shape.from_config(self.config, self.sequence_length)
        model_flops = samples_per_second * flops.train_flops_per_sequence(shape)
        if self._cpu and self._peak and model_flops > self._peak:
            # The cached CPU peak was measured while other jobs were busy: measured again
            # once per run (a few seconds), and never below what this run does.
            if self._remeasure:
                self._remeasure = False
                measured = throughput.cpu_peak_flops(refresh=True, at_least=model_flops)
                self._peak = max(measured or 0.0, model_flops)
                self._say(
                    f"the CPU's peak was measured again ({self._peak / 1e9:.1f} "
                    "GFLOP/s): this run did more model FLOP/s than the cached figure"
                )
            else:
                self._peak = model_flops  # at least what the machine was just seen to do
        return {
            "step_time": self.global_batch / samples_per_second,
            "mfu": throughput.mfu(model_flops, self._peak),
        }

    def _check_finite(self, row):
        if not math.isfinite(row["loss"]):
            self.model.stop_training = True
            raise DivergedError(
                f"the training loss became {row['loss']} by step {row['step']}; the last good "
                "checkpoint is kept. Lower train.learning_rate or set train.clip_norm, then "
                "re-run with --accept-changes (accept_changes=True) to resume from it with them."
            )

    def _emit(self, row):
        if not self.write_files:
            return
        row = {k: v for k, v in row.items() if v is not None}
        with storage.writing(
            self._jsonl.path,
            "metrics",
            "the checkpoints are intact; free some space and run the same training again to resume",
        ):
            self._jsonl.write(json.dumps(row) + "\n")
        if any(True for _ in trackers.numeric_items(row)):
            for tracker in self._trackers:
                tracker.log(row)
        if self._progbar and row["split"] == "train":
            self._progbar.update(row["step"], row)
            return
        parts = [_shown(k, v) for k, v in row.items() if k not in ("step", "split")]
        self._say(
            f"step {row['step']}/{self.config.train.steps} [{row['split']}] " + "  ".join(parts)
        )

    def _say(self, line: str):
        """A line of its own: above a live bar, or logged."""
        if not self.write_files:
            return
        if self._progbar:
            self._progbar.note(line)
        else:
            logger.info(line)

    def close(self, failed: bool = False):
        """Waits for the checkpoint in flight to commit, then closes the bar, the log
        files and the trackers (their runs marked failed when `failed`)."""
        self._compile_clock.__exit__(None, None, None)
        try:
            if self.checkpoints is not None:
                self.checkpoints.close()
        finally:
            if self._progbar:
                self._progbar.close()
            if self.write_files:
                self._jsonl.close()
                for tracker in self._trackers:
                    tracker.close(failed)


def _is_number(value) -> bool:
    """A scalar metric value (Python or NumPy/JAX 0-d), not a bool."""
    if isinstance(value, bool):
        return False
    try:
        return np.ndim(value) == 0 and np.issubdtype(np.asarray(value).dtype, np.number)
    except (TypeError, ValueError):
        return False


def _shown(key: str, value) -> str:
    """A metric as a log line shows it: MFU in percent, as `kroberta.report` prints it
    (metrics.jsonl keeps the fraction)."""
    if key == "mfu":
        return f"mfu {100 * value:.1f}%"
    return f"{key} {value:.4g}" if isinstance(value, float) else f"{key} {value}"

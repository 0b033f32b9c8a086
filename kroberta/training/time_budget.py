"""`train.time_budget`: the run's length fixed once, from measured steps (Cramming's
budget-defined schedule).

The learning-rate schedule depends on `train.steps` (the decay ends there, and with
`train.warmup_fraction` the warmup's length too), and Keras builds it into the compiled
step, so the steps must be known before the run's first step. A run with a budget
therefore measures first, on a throwaway model of the same shape, batch and program:
one dispatch that compiles (not timed), then about `MEASURED_STEPS` steps, each
dispatch's end timed (the median dispatch is the pace), and one evaluation when the run
evaluates (its compilation apart from its time). The run's own model never trains the
measured steps; it is built afterwards for the steps that fit, so every step it trains
has the learning rate of the final schedule:

    steps = (budget - time so far - the run's build, compilations and fit start - one
             evaluation) / (step time + evaluation time / train.eval_every)

rounded down to whole dispatches (`train.steps_per_execution`). The budget counts from
the call of `train`. Process 0's number is every process's
(`distribute.broadcast_from_main`). The run's config.toml records the steps beside the
budget; a resumed run reads them there and measures nothing, so it trains the same steps
to the same weights as a run that was never interrupted.

Not counted: the linear probe (`train.downstream`), checkpoint writes that block the
step loop and the final model's save; a run with a slow probe ends after its budget.
"""

import dataclasses
import gc
import logging
import math
import statistics
import time

from kroberta import run_layout
from kroberta.config import Config, TrainConfig, parse_duration, validate
from kroberta.errors import ConfigError

MEASURED_STEPS = 20  # timed after the first dispatch; at least two dispatches

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Measurement:
    """What the throwaway model took, in seconds."""

    step_seconds: float  # per optimizer step, no compilation in it
    first_step: int  # the timed steps, first_step..last_step (counted from 1)
    last_step: int
    build_seconds: float  # building the model and its optimizer (the run builds its own)
    compile_seconds: float  # the training step's compilation (the run compiles its own)
    eval_seconds: float = 0.0  # one evaluation without its compilation; 0: no validation data
    eval_compile_seconds: float = 0.0
    start_seconds: float = 0.0  # what a `fit` takes before its steps (the pipeline's shuffle
    # buffer filling): the run pays it once


def steps_within(
    budget_seconds: float,
    elapsed: float,
    measured: Measurement,
    eval_every: int,
    steps_per_dispatch: int,
) -> int:
    """The optimizer steps that fit in what is left of the budget after `elapsed` seconds:
    whole dispatches of `steps_per_dispatch`, each evaluation's share counted (one every
    `eval_every` steps, and one at the end); 0 when none fits."""
    m = measured
    left = (
        budget_seconds
        - elapsed
        - m.build_seconds
        - m.compile_seconds
        - m.start_seconds
        - m.eval_compile_seconds
        - m.eval_seconds
    )  # the evaluation at the end
    per_step = m.step_seconds + (m.eval_seconds / eval_every if eval_every else 0.0)
    if left <= 0 or per_step <= 0:
        return 0
    steps = math.floor(left / per_step)
    return steps - steps % steps_per_dispatch


def resolve(config: Config, previous: Config | None) -> tuple[Config, bool]:
    """Before any compute: the config with the steps its run directory recorded for the
    budget, and whether the steps must be measured (a budget, and no run to resume).
    A budget overrides `train.steps` (`config.validate` refuses the two given together).
    `previous`: the recorded config of the run to resume (`RunDirState.recorded`); None
    when there is none, or the run starts over (`force`).

    Raises ConfigError when the run directory holds a run whose steps another budget (or
    none) fixed.
    """
    t = config.train
    if not t.time_budget:
        return config, False
    if previous is None:
        return config, True
    was = previous.train.time_budget
    if was != t.time_budget:
        raise ConfigError(
            f"train.time_budget: {config.run_dir} holds a run of {previous.train.steps:,} steps "
            + (f"fixed by the budget {was!r}" if was else "set by train.steps")
            + f", not by {t.time_budget!r}; a budget fixes the steps once, when a run starts: use "
            "another --run_dir, or --force (force=True) to start over there"
        )
    fixed = previous.train.steps
    logger.info(
        f"time budget {t.time_budget}: {fixed:,} steps, fixed when the run started "
        f"(its {run_layout.CONFIG_FILE})"
    )
    return config.with_section("train", steps=fixed), False


def fix_steps(config: Config, run_data, plan, started: float) -> Config:
    """`config` with `train.steps` fixed from the budget (`plan`: the run's, its
    `steps_per_execution` resolved; `started`: `time.perf_counter()` when training was
    called). Every process measures (the throwaway steps are collectives) and takes
    process 0's steps. Logs the line that says how the steps were found.

    Raises ConfigError when no step fits, or the steps that fit are fewer than the
    warmup or decay the config asks for."""
    # start-up: loaded for a budget run only
    from kroberta.parallel import distribute

    t = plan.config.train
    budget = parse_duration(t.time_budget)
    measured = measure(plan, dataclasses.replace(run_data, config=plan.config))
    gc.collect()  # the throwaway model's buffers, before the run's own model is built
    elapsed = time.perf_counter() - started
    k = t.steps_per_execution
    steps = distribute.broadcast_from_main(steps_within(budget, elapsed, measured, t.eval_every, k))
    before = elapsed + measured.build_seconds + measured.compile_seconds + measured.start_seconds
    if steps < 1:
        raise ConfigError(
            f"train.time_budget={t.time_budget!r}: no training step fits: start-up, the "
            f"measurement and the compilation take {before + measured.eval_compile_seconds:.0f} s "
            f"and {k} step(s) {k * measured.step_seconds:.2f} s; give a longer budget"
        )
    fixed = config.with_section("train", steps=steps)
    try:
        fixed = validate(fixed, "the steps the budget fixed")
    except ConfigError as error:
        raise ConfigError(
            f"train.time_budget={t.time_budget!r} fits {steps:,} steps; "
            f"{error}; give a longer budget"
        ) from None
    evaluations = (
        f"; evaluations ~{measured.eval_seconds * (steps // t.eval_every + 1):.0f} s"
        if measured.eval_seconds and t.eval_every
        else ""
    )
    replaced = (
        f", in place of train.steps={config.train.steps:,}"
        if config.train.steps != TrainConfig.steps
        else ""
    )
    logger.info(
        f"time budget {t.time_budget}: {steps:,} steps at {measured.step_seconds:.2g} "
        f"s/step measured over steps {measured.first_step}-{measured.last_step} "
        f"(start-up, measurement and compilation {before:.0f} s{evaluations}{replaced})"
    )
    return fixed


def measure(plan, run_data) -> Measurement:
    """Times the run's program on a throwaway model (built as the run's is, then dropped)."""
    # start-up: JAX, Keras and the model load with the run
    import keras

    from kroberta.model.mlm import build_compiled_model
    from kroberta.training.compile_clock import CompileClock
    from kroberta.training.run_data import train_batches, validation_batches

    config = plan.config
    k = config.train.steps_per_execution
    dispatches = 1 + max(2, math.ceil(MEASURED_STEPS / k))  # the first compiles

    built = time.perf_counter()
    model = build_compiled_model(config, run_data.word_starts)
    build_seconds = time.perf_counter() - built
    with CompileClock() as clock:
        # When each dispatch ended: a callback with on_train_batch_end makes Keras bring the
        # step's logs to the host first, so the time is the dispatch's end, not its start.
        ends = []
        ended = keras.callbacks.LambdaCallback(
            on_train_batch_end=lambda batch, logs: ends.append(time.perf_counter())
        )
        began = time.perf_counter()
        batches = train_batches(run_data, plan.process_batch, 0, shard=plan.data_shard)
        model.fit(
            batches.take(dispatches * k),
            steps_per_epoch=dispatches * k,
            epochs=1,
            verbose=0,
            shuffle=False,
            callbacks=[ended],
        )
        compile_seconds = clock.seconds
        # The median dispatch: a moment when other jobs took the machine is not the run's pace.
        step_seconds = statistics.median(b - a for a, b in zip(ends, ends[1:])) / k
        # Before the first dispatch ended: the compilation, the pipeline's start (its shuffle
        # buffer filling, which the run pays once) and the dispatch itself.
        start_seconds = max(ends[0] - began - compile_seconds - k * step_seconds, 0.0)
        eval_seconds = eval_compile_seconds = 0.0
        if run_data.validation is not None:
            before, began = clock.seconds, time.perf_counter()
            model.evaluate(
                validation_batches(run_data, plan.micro_batch, shard=plan.data_shard), verbose=0
            )
            eval_compile_seconds = clock.seconds - before
            eval_seconds = max(time.perf_counter() - began - eval_compile_seconds, 0.0)
    return Measurement(
        step_seconds=step_seconds,
        first_step=k + 1,
        last_step=dispatches * k,
        build_seconds=build_seconds,
        compile_seconds=compile_seconds,
        eval_seconds=eval_seconds,
        eval_compile_seconds=eval_compile_seconds,
        start_seconds=start_seconds,
    )

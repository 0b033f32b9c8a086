"""Planning device memory by compiling: what a config needs, what to change when it
does not fit, and the largest per-device batch that fits.

Every figure is XLA's memory analysis of the real K-step training program
(`kroberta.perf.aot_programs.compile_train`) for the given devices (a TPU topology's
abstract devices, or the devices of this host), so remat policies, attention dropout,
mixed precision and the distribution's sharding are all counted as they will run.

    python -m kroberta.aot --config base --topology v3:2x2 --max-batch
"""

import dataclasses
import logging

from kroberta.config import Config
from kroberta.errors import ConfigError
from kroberta.perf import aot_programs
from kroberta.perf.hardware import GiB

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Measured:
    """The training program's per-device bytes for one config (None if XLA refused it)."""

    batch_size_per_device: int
    total_bytes: float  # from the memory analysis, or XLA's "at least" when it refused
    flops: float | None  # per device per step; None when XLA refused to compile
    refused: bool = False
    available: float | None = None  # what XLA said the device offers, when it refused

    def fits(self, budget: float) -> bool:
        return not self.refused and self.total_bytes <= budget


def measure(config: Config, devices, model=None) -> Measured:
    """Compiles `config`'s training program for `devices`; its per-device memory.

    Args:
        config: the config (its batch, remat, attention dropout, strategy...).
        devices: the devices to compile for (a topology's or this host's).
        model: the built training model of `config` (`aot_programs.build_model`), to
            reuse one build for several batches; built here when None.
    """
    if model is None:
        model = aot_programs.build_model(config)
    per_device = config.train.batch_size_per_device
    try:
        program = aot_programs.compile_config_train(model, config, devices)
    except Exception as error:
        exhausted, needed, available = aot_programs.out_of_memory(error)
        if not exhausted:
            raise
        return Measured(
            per_device,
            float("inf") if needed is None else needed,
            None,
            refused=True,
            available=available,
        )
    return Measured(per_device, float(program.total_bytes), program.flops)


def max_batch(
    config: Config,
    devices,
    budget: float,
    model=None,
    multiple: int = 8,
    known: Measured | None = None,
) -> tuple[int, Measured | None, int]:
    """The largest per-device batch (a multiple of `multiple`, or below it any size) whose
    training program fits in `budget` bytes per device, found by compiling
    (`largest_fitting`); `known` is a measurement already made (not compiled again).
    Returns (batch, its measurement, measurements); batch 0 when not even one sequence
    fits."""
    if model is None:
        model = aot_programs.build_model(config)

    def at(b: int) -> Measured:
        if known is not None and known.batch_size_per_device == b:
            return known
        m = measure(config.with_section("train", batch_size_per_device=b), devices, model)
        logger.info(
            f"  batch {b} per device: {'refused by XLA, ' if m.refused else ''}"
            f"{m.total_bytes / GiB:.2f} GiB{' (fits)' if m.fits(budget) else ''}"
        )
        return m

    return largest_fitting(at, max(1, config.train.batch_size_per_device), budget, multiple)


# How far past the batch at which memory proportional to the batch would fill the budget the
# second compile aims (a fixed part, weights and optimizer state, does not grow with it).
PAST = 4
# No per-device batch beyond this is searched for (a device that holds it holds any).
LARGEST = 2**16


def largest_fitting(
    at, first: int, budget: float, multiple: int = 8
) -> tuple[int, Measured | None, int]:
    """The largest batch b (a multiple of `multiple`, or below it any size) with
    `at(b).fits(budget)`, calling `at` (one compile each) as few times as it can.

    Memory grows with the batch close to affinely, a little below a line (XLA reuses
    buffers), so each guess is one step past where the line through two measurements
    meets the budget: XLA refuses a program that does not fit in seconds, naming the bytes
    it needs and what the device really offers (its memory less a reserve: from the first
    refusal on, the target), while one that fits compiles whole. While everything fits it
    steps up (at most 16x); guesses that keep landing on one side of the edge move towards
    the other (the Illinois rule of false position). Returns (batch, its measurement,
    compiles); batch 0 when not even one sequence fits.
    """
    seen: dict[int, Measured] = {}
    sides: list[bool] = []  # whether each guess between two measurements fitted

    def snap(b: float) -> int:
        b = int(b)
        return max(1, b - b % multiple) if b >= multiple else max(1, b)

    def step(b: int) -> int:
        return multiple if b >= multiple else 1

    def crossing(low: int, high: int, target: float, m_high: float | None = None) -> float:
        """Where the line through the measurements at `low` and `high` (or `m_high` bytes
        there) reaches `target`."""
        m_low = seen[low].total_bytes
        m_high = seen[high].total_bytes if m_high is None else m_high
        if not m_low < m_high < float("inf"):
            return (low + high) / 2
        return low + (target - m_low) * (high - low) / (m_high - m_low)

    seen[first] = at(first)
    # the second batch aims well past the edge (PAST x where the line through zero meets the
    # budget): a refusal costs seconds and names the bytes it needs, a second point for the
    # line; twice the batch when the first did not fit
    m = seen[first].total_bytes
    high = PAST * first * budget / m if seen[first].fits(budget) and m > 0 else 0
    second = snap(min(max(high, 2 * first), 32 * first))
    seen[second] = at(second)
    while True:
        fitting = sorted(b for b, m in seen.items() if m.fits(budget))
        lo = fitting[-1] if fitting else 0
        hi = min((b for b, m in seen.items() if b > lo and not m.fits(budget)), default=None)
        if (hi is not None and hi - lo <= step(lo)) or (hi is None and lo >= LARGEST):
            return lo, seen.get(lo), len(seen)
        offered = [m.available for m in seen.values() if m.available]
        target = min([budget, *offered])
        if hi is None:  # everything tried fits: step up along the line through two of them
            below = [b for b in fitting[:-1] if seen[b].total_bytes < seen[lo].total_bytes]
            guess = crossing(below[0], lo, target) if below else 2 * lo
            guess = min(max(guess, lo + step(lo)), 16 * lo)
        elif lo == 0:  # nothing tried fits: halve
            guess = hi / 2
        else:
            # the Illinois rule: while guesses keep landing on one side, halve the far
            # measurement's distance from the target for each repeat (then its line
            # crosses nearer to it), or, below it, bisect
            repeats = (
                next((i for i, side in enumerate(reversed(sides)) if side != sides[-1]), len(sides))
                if sides
                else 0
            )
            if repeats >= 2 and not sides[-1]:
                guess = (lo + hi) / 2
            else:
                far = seen[hi].total_bytes
                guess = crossing(lo, hi, target, target + (far - target) / 2 ** max(0, repeats - 1))
        # one step past the estimate: a refused compile stops at XLA's buffer assignment
        # (seconds), a fitting one compiles the whole program (minutes)
        guess = snap(guess) + step(lo)
        if hi is not None:
            guess = min(max(guess, lo + step(lo)), hi - step(lo))
            guess = snap(guess) if snap(guess) > lo else lo + step(lo)
        seen[guess] = at(guess)
        if hi is not None and lo:
            sides.append(seen[guess].fits(budget))


@dataclasses.dataclass(frozen=True)
class Option:
    """One change to a config that does not fit, with what it would need."""

    describe: str  # the command-line overrides
    why: str  # what it costs
    measured: Measured


def options(config: Config, devices, budget: float) -> list[Option]:
    """Changes that make a training program that does not fit fit, cheapest first, each
    compiled: a selective remat policy (recomputes attention's elementwise work or its
    batched matmuls), fsdp (weights and AdamW state sharded; all-gathers per step),
    half the micro-batch with twice the accumulation (same global batch, smaller
    matmuls), full remat (~+33% FLOPs). Stops at the first that fits, so the cheapest
    fitting change comes last in the list; the others show what they would need."""
    t, d = config.train, config.distributed
    candidates = []
    if t.remat == "none":
        candidates += [
            (
                config.with_section("train", remat="dots"),
                "--train.remat=dots",
                "recomputes the elementwise work",
            ),
            (
                config.with_section("train", remat="dots_no_batch"),
                "--train.remat=dots_no_batch",
                "recomputes attention and the elementwise work",
            ),
        ]
    if d.strategy == "data":
        fsdp = config.with_section("distributed", strategy="fsdp")
        candidates.append(
            (
                fsdp,
                "--distributed.strategy=fsdp",
                "shards weights and AdamW state; gathers weights every step",
            )
        )
    if t.batch_size_per_device >= 2:
        half = config.with_section(
            "train",
            batch_size_per_device=t.batch_size_per_device // 2,
            gradient_accumulation_steps=t.gradient_accumulation_steps * 2,
        )
        candidates.append(
            (
                half,
                f"--train.batch_size_per_device={t.batch_size_per_device // 2} "
                f"--train.gradient_accumulation_steps={t.gradient_accumulation_steps * 2}",
                "same global batch in two smaller micro-batches",
            )
        )
    if t.remat != "full":
        candidates.append(
            (
                config.with_section("train", remat="full"),
                "--train.remat=full",
                "recomputes each block: ~+33% FLOPs",
            )
        )
    found = []
    for candidate, overrides, why in candidates:
        try:
            measured = measure(candidate, devices)
        except ConfigError as error:  # e.g. an fsdp axis that does not divide the heads
            logger.info(f"  {overrides}: not possible here ({error})")
            continue
        logger.info(
            f"  {overrides}: {measured.total_bytes / GiB:.2f} GiB"
            f"{' (fits)' if measured.fits(budget) else ''}"
        )
        found.append(Option(overrides, why, measured))
        if measured.fits(budget):
            break
    return found

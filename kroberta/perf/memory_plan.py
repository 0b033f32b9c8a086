"""Planning device memory by compiling: what a config needs, what to change when it
does not fit, and the largest per-device batch that fits.

Every figure is XLA's memory analysis of the real K-step training program
(`kroberta.perf.aot_programs.compile_train`) for the given devices (a TPU topology's
abstract devices, or the devices of this host), so remat policies, attention dropout,
mixed precision and the distribution's sharding are all counted as they will run.

    python -m kroberta.aot --config base --topology v3:2x2 --max-batch
"""

import dataclasses

from kroberta.config import Config

GiB = 2**30


@dataclasses.dataclass(frozen=True)
class Measured:
    """The training program's per-device bytes for one config (None if XLA refused it)."""

    batch_size_per_device: int
    total_bytes: float  # from the memory analysis, or XLA's "at least" when it refused
    flops: float | None  # per device per step; None when XLA refused to compile
    refused: bool = False

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
    from kroberta.perf import aot_programs

    if model is None:
        model = aot_programs.build_model(config)
    shape = aot_programs.program_shape(config, devices)
    per_device = config.train.batch_size_per_device
    try:
        program = aot_programs.compile_train(model, shape.distribution, shape.global_batch,
                                             shape.length, shape.slots, shape.steps,
                                             config.data.step_input())
    except Exception as error:
        exhausted, needed = aot_programs.out_of_memory(error)
        if not exhausted:
            raise
        return Measured(per_device, float("inf") if needed is None else needed, None,
                        refused=True)
    return Measured(per_device, float(program.total_bytes), program.flops)


def with_train(config: Config, **changes) -> Config:
    return dataclasses.replace(config, train=dataclasses.replace(config.train, **changes))


def max_batch(config: Config, devices, budget: float, model=None, multiple: int = 8,
              log=None) -> tuple[int, Measured | None, int]:
    """The largest per-device batch (a multiple of `multiple`, or below it any size) whose
    training program fits in `budget` bytes per device.

    Memory is close to affine in the batch, so two compiles (the config's batch and
    twice it) give a first guess; compiles around it bracket the answer and a bisection
    settles it: usually 4-6 compiles. Returns (batch, its measurement, compiles); batch
    0 when not even one sequence fits.
    """
    from kroberta.perf import aot_programs

    if model is None:
        model = aot_programs.build_model(config)
    seen: dict[int, Measured] = {}

    def at(b: int) -> Measured:
        if b not in seen:
            seen[b] = measure(with_train(config, batch_size_per_device=b), devices, model)
            if log:
                m = seen[b]
                log(f"  batch {b} per device: {'refused by XLA, ' if m.refused else ''}"
                    f"{m.total_bytes / GiB:.2f} GiB{' (fits)' if m.fits(budget) else ''}")
        return seen[b]

    def snap(b: float) -> int:
        b = int(b)
        return max(1, b - b % multiple) if b >= multiple else max(1, b)

    def granularity(b: int) -> int:
        return multiple if b >= multiple else 1

    first = max(1, config.train.batch_size_per_device)
    a, b = at(first), at(2 * first)
    # An XLA refusal still names what the program needs (at least): good for a slope.
    if b.total_bytes > a.total_bytes and b.total_bytes != float("inf") and not a.refused:
        slope = (b.total_bytes - a.total_bytes) / first
        guess = snap(first + (budget - a.total_bytes) / slope)
    else:
        guess = first if a.fits(budget) else snap(first / 2)

    def bounds():
        fitting = [k for k, m in seen.items() if m.fits(budget)]
        failing = [k for k, m in seen.items() if not m.fits(budget)]
        return max(fitting, default=0), min(failing, default=None)

    lo, hi = bounds()
    if (hi is None or guess < hi) and guess > lo:
        at(guess)
        lo, hi = bounds()
    while hi is None:  # everything tried fits: step up, doubling the step
        at(lo + granularity(lo) * (1 + len(seen) - 2))
        lo, hi = bounds()
    while lo == 0 and hi > 1:  # nothing tried fits: halve
        at(snap(hi / 2))
        lo, hi = bounds()
    while hi - lo > granularity(lo):  # bisect
        middle = snap((lo + hi) / 2)
        if middle <= lo:
            break
        at(middle)
        lo, hi = bounds()
    return lo, seen.get(lo), len(seen)


@dataclasses.dataclass(frozen=True)
class Option:
    """One change to a config that does not fit, with what it would need."""

    describe: str  # the command-line overrides
    why: str  # what it costs
    measured: Measured


def options(config: Config, devices, budget: float, log=None) -> list[Option]:
    """Changes that make a training program that does not fit fit, cheapest first, each
    compiled: a selective remat policy (recomputes attention's elementwise work or its
    batched matmuls), fsdp (weights and AdamW state sharded; all-gathers per step),
    half the micro-batch with twice the accumulation (same global batch, smaller
    matmuls), full remat (~+33% FLOPs). Stops at the first that fits, so the cheapest
    fitting change comes last in the list; the others show what they would need."""
    from kroberta.config import STRATEGIES

    t, d = config.train, config.distributed
    candidates = []
    order = ("dots", "dots_no_batch")
    for remat in order:
        if t.remat == "none":
            candidates.append((with_train(config, remat=remat), f"--train.remat={remat}",
                               "recomputes the elementwise work" if remat == "dots" else
                               "recomputes attention and the elementwise work"))
    if d.strategy == "data" and "fsdp" in STRATEGIES:
        fsdp = dataclasses.replace(config, distributed=dataclasses.replace(d, strategy="fsdp"))
        candidates.append((fsdp, "--distributed.strategy=fsdp",
                           "shards weights and AdamW state; gathers weights every step"))
    if t.batch_size_per_device >= 2:
        half = with_train(config, batch_size_per_device=t.batch_size_per_device // 2,
                          gradient_accumulation_steps=t.gradient_accumulation_steps * 2)
        candidates.append((half, f"--train.batch_size_per_device={t.batch_size_per_device // 2} "
                           f"--train.gradient_accumulation_steps={t.gradient_accumulation_steps * 2}",
                           "same global batch in two smaller micro-batches"))
    if t.remat != "full":
        candidates.append((with_train(config, remat="full"), "--train.remat=full",
                           "recomputes each block: ~+33% FLOPs"))
    found = []
    from kroberta.config import ConfigError

    for candidate, overrides, why in candidates:
        try:
            measured = measure(candidate, devices)
        except ConfigError as error:  # e.g. an fsdp axis that does not divide the heads
            if log:
                log(f"  {overrides}: not possible here ({error})")
            continue
        if log:
            log(f"  {overrides}: {measured.total_bytes / GiB:.2f} GiB"
                f"{' (fits)' if measured.fits(budget) else ''}")
        found.append(Option(overrides, why, measured))
        if measured.fits(budget):
            break
    return found

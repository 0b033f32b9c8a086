"""How many steps one compiled dispatch holds: `train.steps_per_execution = "auto"`.

A dispatch of K fused steps costs the host a roughly fixed amount of work (the
Python around `fit`'s loop, one super-batch from tf.data, one transfer, the
callbacks), about a millisecond. A small model on a TPU or GPU computes a step in
well under that, so "auto" makes each dispatch hold at least `TARGET_SECONDS` of
compute at the devices' peak: K = ceil(TARGET_SECONDS / floor per step), then the
largest divisor of `train.log_every` not above it (logging, evaluation and
checkpoints happen between dispatches), at most half of `log_every` (so each log
interval has a timed dispatch after its first) and at most `MAX_STEPS` (the
super-batch lives in device memory; K batches of input are small next to the
weights, but not free).
On a CPU one seed step takes far longer than the target, so "auto" is 1 there.
"""

import math

from kroberta.config import Config
from kroberta.perf import flops

TARGET_SECONDS = 0.02  # compute per dispatch: ~1 ms of host work is then <= 5% of it
MAX_STEPS = 256
UNKNOWN_PEAK_STEPS = 32  # a device whose peak kroberta does not know: likely fast


def choose(flops_per_step: float, peak_flops: float | None, log_every: int) -> tuple[int, str]:
    """(K, the reason in words) for a step of `flops_per_step` on devices of `peak_flops`."""
    if not peak_flops:
        wanted = UNKNOWN_PEAK_STEPS
        why = f"the devices' peak FLOP/s is unknown: {wanted} wanted"
    else:
        floor = flops_per_step / peak_flops
        wanted = max(1, math.ceil(TARGET_SECONDS / floor))
        why = (
            f"{flops_per_step / 1e9:.3g} GFLOP per step at {peak_flops / 1e12:.3g} TFLOP/s "
            f"is {floor * 1e3:.3g} ms; {wanted} step(s) hold {TARGET_SECONDS * 1e3:g} ms"
        )
    # At most half an interval: the interval's first dispatch holds the compilation,
    # so every log row keeps a timed dispatch after it (samples/s, step_time).
    limit = min(wanted, MAX_STEPS, max(1, log_every // 2))
    k = next(d for d in range(limit, 0, -1) if log_every % d == 0)  # the largest divisor
    if k < wanted:
        why += (
            f"; the largest divisor of train.log_every={log_every} up to "
            f"{min(MAX_STEPS, max(1, log_every // 2))} is {k}"
        )
    return k, why


def steps_for(
    config: Config, peak_flops: float | None, global_batch: int, sequence_length: int | None = None
) -> tuple[int, str]:
    """(K, why) for training steps of `global_batch` sequences on devices of `peak_flops`
    together ("auto")."""
    shape = flops.Shape.from_config(config, sequence_length)
    return choose(
        flops.train_flops_per_step(shape, global_batch), peak_flops, config.train.log_every
    )


def prediction_group(
    config: Config, peak_flops: float | None, global_batch: int, slots: int, length: int
) -> int:
    """G for "auto": prediction batches per dispatch that hold enough forward FLOPs to
    hide the host (then a short last group, filled with padding batches, wastes at most
    that: ~20 ms at the devices' peak, and every input size shares one program)."""
    shape = flops.Shape.from_config(config, length, slots)
    work = flops.forward_flops_per_sequence(shape) * global_batch
    return choose(work, peak_flops, MAX_STEPS)[0]


def at_most_needed(group: int, examples: int | None, global_batch: int) -> int:
    """`group`, but no more batches than `examples` fill, rounded up to a power of two
    (so inputs of similar sizes share one program)."""
    if examples is None:
        return group
    needed = max(1, -(-examples // global_batch))
    return min(group, 1 << (needed - 1).bit_length())

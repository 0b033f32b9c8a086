"""The shape advisor: `python -m kroberta.train --explain [--config ...] [overrides]`.

Prints what a config costs before anything is trained: parameters, FLOPs per
token, memory per device (XLA's memory analysis of the real compiled train step
when that is cheap, else the analytic estimate of kroberta.perf.flops) and warnings
about shapes that waste a TPU's matrix units.

Why 128: TPU MXUs are 128x128 systolic arrays (v2-v5e; 256x256 on v6e) and XLA
tiles the last two dims of every matmul operand in 8x128 blocks, so a hidden size
of 300 is computed as 384 and the extra rows and columns are pure waste. GPU
tensor cores want multiples of 8-64 as well. Head size is checked against 64
(RoBERTa/BERT's size; XLA batches the heads, and 64-wide heads pack two per 128
lanes), everything else against 128. The waste figures are estimates: the
model's matmul FLOPs with the flagged dims padded up, compared to the real ones.
"""

import dataclasses

from kroberta.config import Config, ModelConfig
from kroberta.model import attention
from kroberta.parallel.distribute import select_devices
from kroberta.perf import aot_programs, flops, hardware, memory_plan
from kroberta.perf.hardware import size_text
from kroberta.perf.plan import make_plan

LANES = 128
HEAD_LANES = 64
# A compiled memory analysis builds and compiles the real train step: a few
# seconds for small models on a CPU, too slow for large ones.
COMPILE_PARAMETER_LIMIT = 30_000_000


def _pad(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple  # rounded up to a multiple


# (the model key, its `flops.Shape` field, the multiple TPUs pad it to)
DIMS = (
    ("hidden_dim", "hidden", LANES),
    ("head_dim", "head_dim", HEAD_LANES),
    ("intermediate_dim", "intermediate", LANES),
    ("vocabulary_size", "vocabulary", LANES),
)


def _padded_forward(shape: flops.Shape, padded=()) -> int:
    """Forward matmul FLOPs with the dims named in `padded` padded as a TPU computes them."""
    size = {
        key: _pad(getattr(shape, field), multiple) if key in padded else getattr(shape, field)
        for key, field, multiple in DIMS
    }
    wide = dataclasses.replace(
        shape,
        hidden=size["hidden_dim"],
        intermediate=size["intermediate_dim"],
        vocabulary=size["vocabulary_size"],
    )
    return sum(flops.forward_breakdown(wide, projections=shape.heads * size["head_dim"]).values())


@dataclasses.dataclass(frozen=True)
class Misalignment:
    key: str
    value: int
    multiple: int
    waste: float  # share of the padded model's FLOPs spent on this dim's padding

    def describe(self) -> str:
        what = (
            "head size (hidden_dim / num_heads)" if self.key == "head_dim" else f"model.{self.key}"
        )
        percent = f"{100 * self.waste:.0f}%" if self.waste >= 0.01 else f"{100 * self.waste:.1f}%"
        return (
            f"{what} = {self.value} is not a multiple of {self.multiple}: TPU matrix units "
            f"pad it to {_pad(self.value, self.multiple)}, ~{percent} of the "
            "model's matmul work would be padding"
        )


def misalignments(shape: flops.Shape) -> list[Misalignment]:
    real = _padded_forward(shape)
    return [
        Misalignment(
            key, getattr(shape, field), multiple, 1 - real / _padded_forward(shape, (key,))
        )
        for key, field, multiple in DIMS
        if getattr(shape, field) % multiple
    ]


def total_waste(shape: flops.Shape) -> float:
    return 1 - _padded_forward(shape) / _padded_forward(shape, [key for key, _, _ in DIMS])


def suggest(model: ModelConfig) -> ModelConfig:
    """A nearby aligned shape: hidden and intermediate rounded up to 128, heads of
    64 (128 when the current heads are wider than 96), vocabulary rounded up to 128
    (the extra embedding rows are never produced by the tokenizer)."""
    hidden = _pad(model.hidden_dim, LANES)
    head = HEAD_LANES if model.head_dim <= 96 else LANES
    return dataclasses.replace(
        model,
        hidden_dim=hidden,
        num_heads=max(1, hidden // head),
        intermediate_dim=_pad(model.intermediate_dim, LANES),
        vocabulary_size=_pad(model.vocabulary_size, LANES),
    )


def warnings_for(config: Config, platform: str | None = None, shapes: bool = True) -> list[str]:
    """One-line warnings about the config's shape (and precision on accelerators).

    `shapes=False` leaves out the TPU-alignment warnings (training on a CPU or GPU,
    where they would only be noise); `--explain` always shows them.
    """
    shape = flops.Shape.from_config(config)
    found = misalignments(shape) if shapes else []
    lines = [m.describe() for m in found]
    if found:
        s = suggest(config.model)
        lines.append(
            f"an aligned shape nearby: --model.hidden_dim={s.hidden_dim} --model.num_heads="
            f"{s.num_heads} --model.intermediate_dim={s.intermediate_dim} "
            f"--model.vocabulary_size={s.vocabulary_size} (~{100 * total_waste(shape):.0f}% of "
            "the current shape's padded work is waste)"
        )
    if platform in ("tpu", "gpu") and not config.train.mixed_precision:
        lines.append(
            "train.mixed_precision=false on an accelerator: float32 matmuls run at a "
            "fraction of the bf16 peak; set --train.mixed_precision=true"
        )
    return lines


def explain(config: Config):
    """Yields the advice for `config` on the current devices, line by line (the command
    prints each as it comes: compiling takes a while). Trains nothing and creates no run
    directory."""
    devices = select_devices(config.distributed)
    platform = devices[0].platform
    m, t = config.model, config.train
    shape = flops.Shape.from_config(config)
    params = flops.parameter_count(m)
    # One micro-batch over these devices; the figures do not depend on the mesh.
    batch = make_plan(config, devices, strategy="data").micro_batch
    yield (
        f"model: {params:,} parameters ({m.num_layers} layers, hidden {m.hidden_dim}, "
        f"{m.num_heads} heads of {m.head_dim}, intermediate {m.intermediate_dim}, "
        f"vocabulary {m.vocabulary_size})"
    )
    yield (
        f"shape: {shape.length} tokens per sequence, {shape.slots} predicted slots; "
        f"batch {batch} = {t.batch_size_per_device} x {len(devices)} {platform} device(s)"
    )
    train_token = flops.flops_per_token(shape, train=True)
    yield (
        f"FLOPs per token: {train_token / 1e6:.2f} M train, "
        f"{flops.flops_per_token(shape, train=False) / 1e6:.2f} M forward (matmuls; "
        f"{flops.train_flops_per_step(shape, batch) / 1e9:.2f} GFLOP per train step)"
    )
    estimate = flops.memory_estimate(shape, params, t.batch_size_per_device, t.mixed_precision)
    yield (
        f"memory per device (estimate): {size_text(estimate.total)} = parameters "
        f"{size_text(estimate.parameters)} + gradients {size_text(estimate.gradients)} "
        f"+ AdamW moments {size_text(estimate.optimizer)} + activations "
        f"~{size_text(estimate.activations)}"
    )
    measured = None
    if params <= COMPILE_PARAMETER_LIMIT:
        measured = aot_programs.compile_config_train(
            aot_programs.build_model(config), config, devices
        )
        if measured:
            yield (
                f"memory per device (XLA, the compiled {measured.steps}-step training "
                f"program on {devices[0].device_kind}): {size_text(measured.total_bytes)} = "
                f"arguments {size_text(measured.argument_bytes)} + temporaries "
                f"{size_text(measured.temp_bytes)} + outputs not aliased "
                f"{size_text(measured.output_bytes - measured.alias_bytes)} + code "
                f"{size_text(measured.code_bytes)}; XLA counts {measured.flops / 1e9:.2f} "
                "GFLOP per device step"
            )
    yield attention.describe(config.model, config.train.mixed_precision, config.train.remat)
    chip = hardware.chip_for_device_kind(devices[0].device_kind)
    if chip:
        needed = measured.total_bytes if measured else estimate.total
        fits = needed < 0.9 * chip.memory_bytes
        floor = flops.train_flops_per_step(shape, batch) / (chip.bf16_flops * len(devices))
        yield (
            f"{chip.name}: {'fits' if fits else 'does NOT fit'} in "
            f"{size_text(chip.memory_bytes)} per device; compute floor "
            f"{floor * 1e3:.3f} ms per step at peak bf16"
        )
        if not fits:
            yield from _options(config, devices, 0.9 * chip.memory_bytes)
    lines = warnings_for(config, platform)
    for line in lines:
        yield f"warning: {line}"
    if not lines:
        yield "shape: aligned (hidden, head size, intermediate and vocabulary)"


def _options(config: Config, devices, budget: float):
    """Compiles the changes that could make the training step fit (kroberta.perf.memory_plan);
    yields what to say about them."""
    yield (
        f"compiling changes that could make it fit in {size_text(budget)} (90% of the "
        "device), cheapest first:"
    )
    found = memory_plan.options(config, devices, budget)
    if found and found[-1].measured.fits(budget):
        yield f"cheapest change that fits: {found[-1].describe} ({found[-1].why})"
    else:
        yield (
            "none of them fits alone; python -m kroberta.aot --max-batch finds the "
            "largest batch per device"
        )

"""Compiling kroberta's train and predict steps for a TPU topology, without a TPU.

JAX compiles for the abstract devices of a topology (`jax.experimental.topologies`,
with libtpu installed) while the model is built on the host CPU; the `Report` gives,
per device, the bytes of arguments, outputs, temporaries and code against the
chip's HBM, XLA's FLOPs per step and the compute floor. `python -m kroberta.aot`
prints it.
"""

import dataclasses
import math
import time

from kroberta.config import Config, validate
from kroberta.errors import ConfigError
from kroberta.model import attention
from kroberta.perf import aot_programs, hardware
from kroberta.perf.hardware import GiB, size_text
from kroberta.runtime.quiet_start import quiet_libtpu_probe

# Compiled here with libtpu 0.0.42; libtpu accepts other slices of these generations
# too ("v4:2x2x2", "v5e:8x8"): generation, colon, chips along each axis.
KNOWN_TOPOLOGIES = ("v2:2x2", "v3:2x2", "v4:2x2x1", "v5e:2x2", "v5e:4x4", "v5p:2x2x1", "v6e:2x2")
# hardware.CHIPS gives figures per device as the TPU runtime counts them: a v2/v3
# device is one of a chip's two cores, a v4/v5p device is a whole (megacore) chip.
# libtpu's compile-only v4 topology has one device per core unless asked for megacore.
_RUNTIME_DEVICES_PER_CHIP = {"TPU v2": 2, "TPU v3": 2}
_CHIP_CONFIG = {"v4": {"chip_config_name": "megacore"}}


@dataclasses.dataclass(frozen=True)
class Report:
    """What `compile_for_topology` measured. Bytes and FLOPs are per device."""

    topology: str
    device_kind: str
    chips: int
    plan: (
        object  # kroberta.perf.plan.Plan: the config, batch, length, slots, mesh and steps compiled
    )
    parameters: int
    hbm_bytes: float  # per device
    peak_flops: float  # bf16 FLOP/s per device
    train: object  # aot_programs.Program
    predict: object
    build_seconds: float
    attention: str  # kroberta.model.attention.attention_path on the TPU

    def floor_seconds(self, program) -> float:
        """The compute floor: the step's FLOPs at the chip's bf16 peak."""
        return program.flops / self.peak_flops

    @property
    def fits(self) -> bool:
        return all(p.total_bytes <= self.hbm_bytes for p in (self.train, self.predict))

    def does_not_fit(self) -> str | None:
        """The one-line error when a program needs more HBM than a device has, else None."""
        worst = max((self.train, self.predict), key=lambda p: p.total_bytes)
        if worst.total_bytes <= self.hbm_bytes:
            return None
        generation = self.topology.split(":")[0]
        return _too_big(worst.total_bytes, self.hbm_bytes, generation, worst.name, self.plan.config)

    def table(self) -> str:
        t, p, plan, config = self.train, self.predict, self.plan, self.plan.config
        mesh = " x ".join(f"{k}={v}" for k, v in plan.topology.mesh_shape.items())
        precision = "bf16 compute, float32 weights" if config.train.mixed_precision else "float32"
        batch = plan.global_batch
        rows = [
            f"topology      {self.topology}: {plan.topology.num_devices} x {self.device_kind} "
            f"({self.chips} chips); mesh {mesh}; strategy {config.distributed.strategy}",
            f"model         {self.parameters:,} parameters; {precision}",
            f"memory        train.remat={config.train.remat}; {self.attention}",
            f"batch         {batch} sequences ({batch // plan.topology.num_devices} per device) x "
            f"{plan.sequence_length} tokens, {plan.slots} prediction slots",
            "",
            f"{'per device':<30}{'train step':>16}{'predict step':>16}",
        ]

        def row(label, a, b):
            rows.append(f"{label:<30}{a:>16}{b:>16}")

        for label, attr in (
            ("arguments", "argument_bytes"),
            ("outputs", "output_bytes"),
            ("  of which donated (aliased)", "alias_bytes"),
            ("temporaries", "temp_bytes"),
            ("generated code", "code_bytes"),
            ("total", "total_bytes"),
        ):
            row(label, size_text(getattr(t, attr)), size_text(getattr(p, attr)))
        row(
            f"  of {size_text(self.hbm_bytes)} HBM",
            f"{t.total_bytes / self.hbm_bytes:.1%}",
            f"{p.total_bytes / self.hbm_bytes:.1%}",
        )
        row("FLOPs per device per step", f"{t.flops / 1e9:.2f} G", f"{p.flops / 1e9:.2f} G")
        row(
            f"compute floor ({self.peak_flops / 1e12:g} TF/s)",
            f"{self.floor_seconds(t) * 1e3:.3f} ms",
            f"{self.floor_seconds(p) * 1e3:.3f} ms",
        )
        row(
            "  = samples/s at most",
            f"{batch / self.floor_seconds(t):,.0f}",
            f"{batch / self.floor_seconds(p):,.0f}",
        )
        row("compile time", f"{t.compile_seconds:.1f} s", f"{p.compile_seconds:.1f} s")
        # How `fit` runs train.steps_per_execution (`kroberta.model.super_batch`).
        k = plan.steps_per_dispatch
        dispatch = (
            "one step per dispatch"
            if k == 1
            else (
                f"{k} steps fused into one program (a lax.scan over a ({k}, batch, ...) super-batch, "
                "one dispatch; memory above is that program's, FLOPs one step's)"
            )
        )
        rows += [
            "",
            f"FLOPs are XLA's cost_analysis of the SPMD program each device runs (per device; "
            f"x{plan.topology.num_devices} for the whole step); train/predict = {t.flops / p.flops:.2f}.",
            f"train.steps_per_execution={k}: {dispatch}.",
            f"predict program: kroberta.predict's top_k (k=5) step, {p.steps} batch(es) per "
            f"dispatch; model built on the host in {self.build_seconds:.1f} s.",
        ]
        return "\n".join(rows)


def _too_big(
    needed: float, hbm: float, generation: str, what: str, config: Config, at_least: bool = False
) -> str:
    """The one-line error of a `what` ("train", "predict") step that needs `needed` bytes
    of `hbm` per device, with the changes of `config` to try."""
    tries = [
        "distributed.strategy=fsdp"
        if config.distributed.strategy == "data"
        else "a larger distributed.model_parallel",
        "a smaller train.batch_size_per_device",
    ]
    if not config.train.mixed_precision:
        tries.append("train.mixed_precision=true")
    advice = ", ".join(tries[:-1]) + " or " + tries[-1]
    amount = f"{'at least ' if at_least else ''}{needed / GiB:.1f} GiB"
    return (
        f"the {what} step needs {amount} of {hbm / GiB:.1f} GiB per device "
        f"on {generation}: try {advice}"
    )


def topology_devices(name: str) -> list:
    """The abstract TPU devices of a topology such as "v2:2x2" (a v2-8)."""
    try:
        import libtpu  # noqa: F401
    except ImportError:
        raise ConfigError(
            'libtpu is not installed: pip install "jax[tpu]==0.10.2" '
            "(the tpu extra; compiles for TPUs on a CPU-only machine)"
        ) from None
    # the tpu extra: only once libtpu was found
    from jax.experimental import topologies

    try:
        options = _CHIP_CONFIG.get(name.split(":")[0], {})
        with quiet_libtpu_probe():  # libtpu's missing-TPU complaints on a CPU machine
            return list(
                topologies.get_topology_desc(topology_name=name, platform="tpu", **options).devices
            )
    except Exception as error:  # jax.errors.JaxRuntimeError from libtpu
        message = str(error).splitlines()[0]
        if "INVALID_ARGUMENT" not in message:
            raise
        raise ConfigError(
            f"unknown TPU topology {name!r} ({message}); valid: "
            f"{', '.join(KNOWN_TOPOLOGIES)} (generation:chips per axis; larger "
            "slices such as v4:2x2x2 work too)"
        ) from None


def per_device_chip(devices) -> tuple[float, float, int]:
    """(HBM bytes, bf16 FLOP/s, chips) per abstract device of a topology."""
    kind = devices[0].device_kind
    chip = hardware.chip_for_device_kind(kind)
    if chip is None:
        raise ConfigError(f"no HBM and peak figures for {kind!r} in kroberta.perf.hardware.CHIPS")
    chips = len({tuple(d.coords) for d in devices})
    share = _RUNTIME_DEVICES_PER_CHIP.get(chip.name, 1) * chips / len(devices)
    return chip.memory_bytes * share, chip.bf16_flops * share, chips


def _compile_or_explain(compile_fn, what, hbm, config, generation):
    """Runs a compile; XLA's out-of-HBM error becomes the one-line ConfigError."""
    try:
        return compile_fn()
    except Exception as error:
        exhausted, needed, _ = aot_programs.out_of_memory(error)
        if not exhausted:
            raise
        if needed is None:
            raise ConfigError(
                f"the {what} step does not fit in HBM on {generation}: {str(error).splitlines()[0]}"
            ) from None
        error = ConfigError(_too_big(needed, hbm, generation, what, config, at_least=True))
        if what == "train":  # kroberta.aot plans the changes that could fit from it
            error.needed_bytes = needed
        raise error from None


def compile_for_topology(
    config: Config, topology_name: str, model=None, hbm_bytes: float | None = None
) -> Report:
    """Compiles `config`'s train and predict steps for a TPU topology; see `Report`.

    `model`: the compiled model of this config (`aot_programs.build_model(config)`), to
    reuse one build for several topologies; built here when None. `hbm_bytes`: plan
    for this much memory per device instead of the chip's (e.g. to leave headroom).

    Raises ConfigError for an unknown topology, a missing libtpu or a program that XLA
    already refuses to compile for lack of HBM (a program that compiles but needs
    more than the HBM is reported: check `report.fits` / `report.does_not_fit()`).
    """
    config = validate(config)
    devices = topology_devices(topology_name)
    hbm, peak, chips = per_device_chip(devices)
    hbm = hbm_bytes or hbm
    generation = topology_name.split(":")[0]
    started = time.perf_counter()
    if model is None:
        model = aot_programs.build_model(config)
    build_seconds = time.perf_counter() - started
    plan = aot_programs.program_plan(config, devices)
    batch, length, slots = plan.global_batch, plan.sequence_length, plan.slots
    # The programs that run: K fused training steps, G prediction batches per dispatch.
    train = _compile_or_explain(
        lambda: aot_programs.compile_config_train(model, config, devices),
        "train",
        hbm,
        config,
        generation,
    )
    predict = _compile_or_explain(
        lambda: aot_programs.compile_predict(
            model, devices, batch, length, slots, group=plan.prediction_group(batch, slots)
        ),
        "predict",
        hbm,
        config,
        generation,
    )
    return Report(
        topology=topology_name,
        device_kind=devices[0].device_kind,
        chips=chips,
        plan=plan,
        parameters=int(sum(math.prod(v.shape) for v in model.trainable_variables)),
        hbm_bytes=hbm,
        peak_flops=peak,
        train=train,
        predict=predict,
        build_seconds=build_seconds,
        attention=attention.attention_path(
            config.model, length, config.train.mixed_precision, platform="tpu"
        ),
    )

"""Compile the train and predict steps for a TPU topology, on a machine without a TPU.

    python -m kroberta.aot --config seed --topology v2:2x2 [--section.key=value ...]
    python -m kroberta.aot --config base --topology v3:2x2 --max-batch

Needs libtpu (`pip install "jax[tpu]==0.10.2"`, libtpu 0.0.42.*); JAX then compiles
for abstract TPU devices (`jax.experimental.topologies`) while running on the CPU.
Prints, per device: the bytes of arguments, outputs, temporaries and code against
the chip's HBM, XLA's FLOPs per step and the compute floor (FLOPs / bf16 peak).
When the training step does not fit, it compiles the changes that could make it
fit (a remat policy, fsdp, a smaller micro-batch with more accumulation, full
remat; kroberta.perf.memory_plan) and prints what each needs, the cheapest fitting
one last. `--max-batch` answers the largest per-device batch whose training step
fits, by compiling (a few compiles). `--device-memory GIB` plans for less memory
than the chip has (headroom for the runtime, or another program beside it).
Exit code 2, with one line on stderr, when a program does not fit in HBM, for an
unknown topology or a bad config.
"""

import os

# libtpu takes /tmp/libtpu_lockfile for the whole process; a training job on the
# same host (which loads libtpu too once it is installed) must not block compiling.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the model is built on the host CPU

import argparse  # noqa: E402
import importlib.metadata  # noqa: E402

from kroberta import cli  # noqa: E402
from kroberta.config import Config, from_command_line, validate  # noqa: E402
from kroberta.errors import ConfigError
from kroberta.perf import memory_plan  # noqa: E402
from kroberta.perf.hardware import GiB  # noqa: E402

# kroberta.perf.tpu_compile.compile_for_topology(config, topology) is the
# command as a function.
from kroberta.perf.tpu_compile import (  # noqa: E402
    KNOWN_TOPOLOGIES,
    compile_for_topology,
    per_device_chip,
    topology_devices,
)


def parse_args(argv: list[str]) -> tuple[Config, argparse.Namespace]:
    parser = cli.ArgumentParser(
        prog="python -m kroberta.aot",
        description="Compile the train and predict steps for a TPU topology without a TPU "
        "(needs libtpu) and report per-device memory, FLOPs and the compute floor. Any "
        "config key can be overridden as --section.key=value, as in kroberta.train.",
    )
    parser.add_argument(
        "--config",
        help="a shipped config by name (base, seed, small, tiny: "
        "kroberta/configs/) or the path of a TOML file",
    )
    parser.add_argument(
        "--topology",
        default="v2:2x2",
        help="TPU topology (default v2:2x2, a v2-8); e.g. " + ", ".join(KNOWN_TOPOLOGIES),
    )
    parser.add_argument(
        "--max-batch",
        action="store_true",
        help="search the largest train.batch_size_per_device whose training "
        "step fits (compiles a few times) instead of the full report",
    )
    parser.add_argument(
        "--device-memory",
        type=float,
        metavar="GIB",
        help="plan for this much memory per device instead of the chip's HBM",
    )
    args, rest = parser.parse_known_args(argv)
    config, sources = from_command_line(args.config, rest)
    config = validate(config, sources)
    return config, args


def _devices_and_budget(args) -> tuple[list, float]:
    """The topology's devices and the bytes per device to plan for."""
    devices = topology_devices(args.topology)
    return devices, args.device_memory * GiB if args.device_memory else per_device_chip(devices)[0]


def _max_batch(config: Config, args) -> None:
    devices, budget = _devices_and_budget(args)
    print(
        f"kroberta.aot --max-batch: {args.config or 'default config'} for {args.topology}, "
        f"{budget / GiB:.2f} GiB per device; train.remat={config.train.remat}, attention "
        f"dropout {config.model.attention_dropout_rate:g}",
        flush=True,
    )
    largest, measured, compiles = memory_plan.max_batch(config, devices, budget)
    if not largest:
        raise ConfigError(
            f"not even one sequence per device fits in {budget / GiB:.2f} GiB on "
            f"{args.topology}; try --train.remat=full or --distributed.strategy=fsdp"
        )
    print(
        f"largest batch per device: {largest} ({measured.total_bytes / GiB:.2f} GiB, "
        f"{measured.flops / 1e9:.1f} GFLOP per device step; {compiles} compiles): "
        f"--train.batch_size_per_device={largest}"
    )


# Beyond this many times the budget no single change recovers the memory (full remat
# and fsdp each save well under half of it): point at --max-batch instead of compiling.
FAR_BEYOND = 3


def _suggest(config: Config, args, problem: str, needed: float | None) -> str:
    """Compiles the changes that could make the training step fit; prints them."""
    devices, budget = _devices_and_budget(args)
    if needed is None or needed > FAR_BEYOND * budget:
        return (
            f"{problem} (far beyond what one change recovers: python -m kroberta.aot "
            "--max-batch finds the largest batch per device)"
        )
    print(
        f"the training step does not fit in {budget / GiB:.2f} GiB per device; compiling "
        "changes that could make it fit, cheapest first:",
        flush=True,
    )
    found = memory_plan.options(config, devices, budget)
    if found and found[-1].measured.fits(budget):
        best = found[-1]
        return (
            f"{problem}; the cheapest change that fits: {best.describe} "
            f"({best.measured.total_bytes / GiB:.2f} GiB; {best.why})"
        )
    return problem


def _compile(argv) -> None:
    config, args = parse_args(argv)
    if args.max_batch:
        return _max_batch(config, args)
    hbm = args.device_memory * GiB if args.device_memory else None
    try:
        report = compile_for_topology(config, args.topology, hbm_bytes=hbm)
    except ConfigError as error:
        needed = getattr(error, "needed_bytes", None)  # set for a train step out of HBM
        if needed is None:
            raise
        raise ConfigError(_suggest(config, args, str(error), needed)) from None
    versions = ", ".join(f"{p} {importlib.metadata.version(p)}" for p in ("jax", "libtpu"))
    print(f"kroberta.aot: {args.config or 'default config'} for {args.topology} ({versions})")
    print(report.table(), flush=True)
    problem = report.does_not_fit()
    if problem:
        if report.train.total_bytes > report.hbm_bytes:
            problem = _suggest(config, args, problem, report.train.total_bytes)
        raise ConfigError(problem)


def main(argv=None) -> int:
    return cli.run(lambda: _compile(argv))

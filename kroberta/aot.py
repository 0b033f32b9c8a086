"""Compile the train and predict steps for a TPU topology, on a machine without a TPU.

    python -m kroberta.aot --config seed --topology v2:2x2 [--section.key=value ...]

Needs libtpu (`pip install "jax[tpu]==0.10.2"`, libtpu 0.0.42.*); JAX then compiles
for abstract TPU devices (`jax.experimental.topologies`) while running on the CPU.
Prints, per device: the bytes of arguments, outputs, temporaries and code against
the chip's HBM, XLA's FLOPs per step and the compute floor (FLOPs / bf16 peak).
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
import sys  # noqa: E402

import kroberta  # noqa: E402,F401  (fixes the backend before keras is imported)
from kroberta import cli as cli_lib  # noqa: E402
from kroberta import config as config_lib  # noqa: E402
from kroberta.config import Config  # noqa: E402
# kroberta.aot.compile_for_topology(config, topology) is the command as a function.
from kroberta.perf.tpu_compile import KNOWN_TOPOLOGIES, AotError, compile_for_topology  # noqa: E402


def parse_args(argv: list[str]) -> tuple[Config, argparse.Namespace]:
    parser = argparse.ArgumentParser(
        prog="python -m kroberta.aot",
        description="Compile the train and predict steps for a TPU topology without a TPU "
        "(needs libtpu) and report per-device memory, FLOPs and the compute floor. Any "
        "config key can be overridden as --section.key=value, as in kroberta.train.",
    )
    parser.add_argument("--config", help="a shipped config by name (base, seed, tiny: "
                        "kroberta/configs/) or the path of a TOML file")
    parser.add_argument("--topology", default="v2:2x2",
                        help="TPU topology (default v2:2x2, a v2-8); e.g. "
                        + ", ".join(KNOWN_TOPOLOGIES))
    args, rest = parser.parse_known_args(argv)
    config, sources = config_lib.from_command_line(args.config, rest)
    config_lib.validate(config, sources)
    return config, args


def _cli(argv) -> None:
    config, args = parse_args(sys.argv[1:] if argv is None else argv)
    report = compile_for_topology(config, args.topology)
    versions = ", ".join(f"{p} {importlib.metadata.version(p)}" for p in ("jax", "libtpu"))
    print(f"kroberta.aot: {args.config or 'default config'} for {args.topology} ({versions})")
    print(report.table(), flush=True)
    problem = report.does_not_fit()
    if problem:
        raise AotError(problem)


def cli(argv=None) -> int:
    return cli_lib.run(lambda: _cli(argv))


if __name__ == "__main__":
    sys.exit(cli())

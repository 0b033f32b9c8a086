"""Per-device memory, the largest batch that fits and XLA FLOPs of a config's training
step on TPU topologies, for remat policies x attention dropout, compiled ahead of time.

    nice python tools/bench_memory.py --config base --lengths 128 512 \\
        --topologies v3:2x2 v2:2x2 v4:2x2x1 v5e:2x2 --remats none dots full \\
        --attention-dropouts 0.1 0 --max-batch --out memory.jsonl
    python tools/bench_memory.py --table memory.jsonl   # the markdown table

Needs libtpu (the `tpu` extra). One JSON line per cell is appended to --out as soon as
it is measured, and cells already in the file are skipped, so an interrupted run
resumes where it stopped; --measured takes the figures at the config's batch from an
earlier run's file instead of compiling them again. Cells run cheapest first (short
sequences first); each model is built once per (length, attention dropout, remat) and
compiled for every topology. Compiling a 125M model takes minutes per compile on a small
machine.
"""

import os

os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

GiB = 2**30


def _cell_key(row) -> tuple:
    return (row["length"], row["topology"], row["remat"], row["attention_dropout"])


def _rows(path) -> dict:
    """The rows of a results file (an earlier run's --out) by cell; none if there is no file."""
    if not path or not os.path.exists(path):
        return {}
    with open(path) as f:
        return {_cell_key(row): row for row in map(json.loads, filter(str.strip, f))}


def measure_cells(args):
    import kroberta  # noqa: F401
    from kroberta.config import apply_overrides, config_path, load_toml, validate
    from kroberta.perf import aot_programs, memory_plan, tpu_compile

    done = set(_rows(args.out))
    earlier = _rows(args.measured)
    for length in args.lengths:
        for attention_dropout in args.attention_dropouts:
            for remat in args.remats:
                todo = [
                    t for t in args.topologies if (length, t, remat, attention_dropout) not in done
                ]
                if not todo:
                    continue
                overrides = [
                    f"model.max_sequence_length={length}",
                    f"model.attention_dropout={attention_dropout}",
                    f"train.remat={remat}",
                    "train.mixed_precision=true",
                    *args.set,
                ]
                config = apply_overrides(load_toml(config_path(args.config)), overrides)
                validate(config)
                started = time.perf_counter()
                model = aot_programs.build_model(config)
                built = time.perf_counter() - started
                for topology in todo:
                    devices = tpu_compile.topology_devices(topology)
                    hbm = tpu_compile.per_device_chip(devices)[0]
                    started = time.perf_counter()
                    known = earlier.get((length, topology, remat, attention_dropout))
                    batch = config.train.batch_size_per_device
                    if known and known["batch_size_per_device"] == batch:
                        at_batch = memory_plan.Measured(
                            batch,
                            known["gib"] * GiB,
                            None if known["refused"] else known["gflops"] * 1e9,
                            known["refused"],
                        )
                    else:
                        known, at_batch = None, memory_plan.measure(config, devices, model)
                    row = {
                        "config": args.config,
                        "length": length,
                        "topology": topology,
                        "remat": remat,
                        "attention_dropout": attention_dropout,
                        "batch_size_per_device": batch,
                        "hbm_gib": hbm / GiB,
                        "gib": at_batch.total_bytes / GiB,
                        "refused": at_batch.refused,
                        "gflops": (at_batch.flops or 0) / 1e9,
                        "build_seconds": built,
                        "measured_earlier": bool(known),
                    }
                    if args.max_batch:
                        largest, measured, compiles = memory_plan.max_batch(
                            config, devices, hbm, model, known=at_batch
                        )
                        row.update(
                            max_batch=largest,
                            compiles=compiles,
                            gib_at_max=measured.total_bytes / GiB if measured else None,
                            gflops_at_max=(measured.flops or 0) / 1e9 if measured else None,
                        )
                    row["seconds"] = time.perf_counter() - started
                    print(json.dumps(row), flush=True)
                    if args.out:
                        with open(args.out, "a") as f:
                            f.write(json.dumps(row) + "\n")


def table(path) -> str:
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    base = {
        (r["length"], r["topology"], r["attention_dropout"]): r["gflops"]
        for r in rows
        if r["remat"] == "none"
    }
    searched = any("max_batch" in r for r in rows)
    lines = [
        "| tokens | topology | attention dropout | remat | GiB per device at batch "
        "| of HBM | GFLOP per device step | recompute |"
        + (" largest batch per device | GiB at it | compiles |" if searched else ""),
        "|---:|---|---:|---|---:|---:|---:|---:|" + ("---:|---:|---:|" if searched else ""),
    ]
    order = {"none": 0, "dots_no_batch": 1, "dots": 2, "full": 3}
    for r in sorted(
        rows,
        key=lambda r: (
            r["length"],
            r["topology"],
            -r["attention_dropout"],
            order.get(r["remat"], 9),
        ),
    ):
        none = base.get((r["length"], r["topology"], r["attention_dropout"]))
        extra = f"+{100 * (r['gflops'] / none - 1):.0f}%" if none and r["gflops"] else ""
        gib = f">= {r['gib']:.1f} (refused)" if r["refused"] else f"{r['gib']:.2f}"
        flops = f"{r['gflops']:.0f}" if r["gflops"] else ""
        line = (
            f"| {r['length']} | {r['topology']} | {r['attention_dropout']:g} | "
            f"{r['remat']} | {gib} at {r['batch_size_per_device']} | "
            f"{r['hbm_gib']:.0f} GiB | {flops} | {extra} |"
        )
        if searched:
            at_max = r.get("gib_at_max")
            at_max = "" if at_max is None else f"{at_max:.2f}"  # None: not one sequence fits
            line += (
                f" **{r['max_batch']}** | {at_max} | {r['compiles']} |"
                if "max_batch" in r
                else " | | |"
            )
        lines.append(line)
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="base")
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 512])
    parser.add_argument(
        "--topologies", nargs="+", default=["v3:2x2", "v2:2x2", "v4:2x2x1", "v5e:2x2"]
    )
    parser.add_argument("--remats", nargs="+", default=["none", "dots", "full"])
    parser.add_argument("--attention-dropouts", type=float, nargs="+", default=[0.1, 0.0])
    parser.add_argument(
        "--max-batch",
        action="store_true",
        help="also search the largest per-device batch that fits (more compiles)",
    )
    parser.add_argument(
        "--set", nargs="*", default=[], help="more config overrides, section.key=value"
    )
    parser.add_argument("--out", help="JSON lines file: appended to, and cells in it skipped")
    parser.add_argument(
        "--measured",
        metavar="JSONL",
        help="an earlier run's --out: its cells' figures at their batch are "
        "taken instead of compiled again (--max-batch starts from them)",
    )
    parser.add_argument(
        "--table", metavar="JSONL", help="print the markdown table of a results file"
    )
    args = parser.parse_args(argv)
    for name, path in (("--measured", args.measured), ("--table", args.table)):
        if path and not os.path.exists(path):
            parser.error(f"{name}: no file {path!r}")
    if args.table:
        print(table(args.table))
        return 0
    from kroberta.runtime import logs

    with logs.configured():  # the search's progress on stderr, the rows on stdout
        measure_cells(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where a kroberta training step spends its time on CPU: XLA's per-op profile, grouped by layer.

    python tools/profile_step.py [--config seed] [--batch 64] [--steps 5] [--top 40]

Runs `model.fit` as `kroberta.train` does (1 simulated CPU device) under
`jax.profiler.trace` with XLA's per-op trace events on, then joins each executed
fusion to the optimized HLO's `op_name` metadata (dumped next to the trace) and
prints, per step:
  - the split between dot (matmul) fusions and everything else,
  - the top groups: forward or backward, plus the model path of the op
    (`roberta_backbone/layer/self_attention_layer/key`, ...; layer numbers folded),
  - the dots with their shapes and achieved GFLOP/s.
Op times overlap (XLA's executor runs independent ops at once), so they add up to
more than the step's wall time; compare groups, not totals.
"""

import argparse
import collections
import dataclasses
import glob
import math
import os
import re
import tempfile

from bench_common import fit_samples_per_second, simulate_cpu_devices


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="seed", help="a shipped config name or a TOML file")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=5, help="profiled steps (after 3 warm-up steps)")
    p.add_argument("--top", type=int, default=40, help="groups and dots printed")
    return p.parse_args()


def main():
    args = parse_args()
    work = tempfile.mkdtemp(prefix="profile_step_")
    dump = os.path.join(work, "hlo")
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_cpu_enable_xprof_traceme=true"
        f" --xla_dump_to={dump} --xla_dump_hlo_as_text"
    )
    simulate_cpu_devices(1)

    import jax

    import kroberta  # noqa: F401  (selects the JAX backend before keras loads)
    from kroberta.config import config_path, load_toml
    from kroberta.data import pipeline
    from kroberta.data.synthetic import write_seed_format
    from kroberta.model.mlm import build_compiled_model
    from kroberta.perf.plan import for_local_devices

    config = load_toml(config_path(args.config))
    L, V = config.model.max_sequence_length, config.model.vocabulary_size
    path = os.path.join(work, "train.tfrecord")
    write_seed_format(path, max(1024, 4 * args.batch), L, V, seed=1)
    config = dataclasses.replace(
        config,
        run_dir=work,
        data=dataclasses.replace(config.data, train=(path,)),
        train=dataclasses.replace(config.train, steps=10**6, batch_size_per_device=args.batch),
    )
    spec = pipeline.inspect_files(config.data.train, "data.train")
    model = build_compiled_model(for_local_devices(config))
    dataset = pipeline.train_dataset(
        spec, config.data, V, args.batch, config.train.seed, device_masks=True
    )  # what training feeds

    fit_samples_per_second(model, dataset, 3, args.batch)  # compile and warm up
    trace_dir = os.path.join(work, "trace")
    with jax.profiler.trace(trace_dir):
        rate = fit_samples_per_second(model, dataset, args.steps + 1, args.batch)

    op_ns = collections.Counter()
    trace = sorted(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True))[-1]
    for plane in jax.profiler.ProfileData.from_file(trace).planes:
        for line in plane.lines:
            if "XLA" not in line.name:
                continue
            for event in line.events:
                if not event.name.startswith(("ThunkExecutor", "SlinkyThreadPool")):
                    op_ns[event.name] += event.duration_ns
    hlo_files = glob.glob(os.path.join(dump, "*jit_train_step*cpu_after_optimizations.txt"))
    hlo = open(max(hlo_files, key=os.path.getsize)).read()
    report(op_ns, hlo, args.steps + 1, rate, args.top)


def report(op_ns, hlo, steps, rate, top):
    per_step = {name: ns / steps / 1e6 for name, ns in op_ns.items()}  # ms
    origin = dict(re.findall(r'^\s*%?([\w.\-]+) = .*?metadata=\{op_name="([^"]*)"', hlo, re.M))
    dots = dot_flops(hlo)
    dot_ms = sum(ms for name, ms in per_step.items() if name in dots)
    print(
        f"fit: {rate:.1f} samples/s; op time per step {sum(per_step.values()):.0f} ms, "
        f"of which dot fusions {dot_ms:.0f} ms"
    )
    groups = collections.Counter()
    for name, ms in per_step.items():
        groups[group_of(origin.get(name, "?"))] += ms
    print(f"\n{'ms/step':>8s}  group (fwd/bwd and op path)")
    for group, ms in groups.most_common(top):
        print(f"{ms:8.2f}  {group}")
    print(f"\n{'ms/step':>8s} {'GFLOP':>7s} {'GFLOP/s':>8s}  dot (output shape, contracted size)")
    ranked = sorted(((per_step.get(n, 0.0), n) for n in dots), reverse=True)[:top]
    for ms, name in ranked:
        flops, shape = dots[name]
        rate = flops / 1e9 / (ms / 1e3) if ms else 0.0
        print(f"{ms:8.2f} {flops / 1e9:7.2f} {rate:8.0f}  {name}: {shape}")


def group_of(op_name: str) -> str:
    """'jit(train_step)/transpose(jvp(roberta_backbone))/transformer_layer_1/x/y/z' ->
    'bwd roberta_backbone/layer/x/y' (the backward pass is JAX's transpose of the jvp)."""
    direction = "bwd" if "transpose(" in op_name else "fwd"
    path = re.sub(r"jit\(train_step\)/", "", op_name)
    path = re.sub(r"transformer_layer_\d+", "layer", path)
    path = re.sub(r"transpose\(|jvp\(|\)", "", path)
    return f"{direction} " + "/".join(path.split("/")[:4])


def dot_flops(hlo: str) -> dict[str, tuple[float, str]]:
    """Executed op name -> (FLOPs, shape) for every dot, bare or inside a fusion."""
    bodies = dict(re.findall(r"^%?([\w.\-]+) \(.*?\) -> .*? \{\n(.*?)\n\}", hlo, re.S | re.M))
    shapes = dict(re.findall(r"%?([\w.\-]+) = \w+\[([\d,]*)\]", hlo))
    result = {}
    for name, kind, callee in re.findall(
        r"^\s*%?([\w.\-]+) = \S+ (fusion|dot)\(.*?(?:calls=%?([\w.\-]+)|$)", hlo, re.M
    ):
        text = (
            bodies.get(callee, "")
            if kind == "fusion"
            else re.search(rf"^\s*%?{re.escape(name)} = .*$", hlo, re.M).group(0)
        )
        flops, described = 0.0, []
        for out, lhs, dims in re.findall(
            r"= \w+\[([\d,]*)\]\S* dot\(%?([\w.\-]+), .*?lhs_contracting_dims=\{([\d,]*)\}", text
        ):
            out_size = math.prod(int(d) for d in out.split(",") if d)
            lhs_shape = [int(d) for d in shapes.get(lhs, "").split(",") if d]
            contracted = 1
            for d in filter(None, dims.split(",")):
                contracted *= lhs_shape[int(d)] if int(d) < len(lhs_shape) else 1
            flops += 2.0 * out_size * contracted
            described.append(f"[{out}] k={contracted}")
        if described:
            result[name] = (flops, " ".join(described))
    return result


if __name__ == "__main__":
    main()

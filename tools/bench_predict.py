"""Prediction vs training throughput of one kroberta model, side by side in one process.

    python tools/bench_predict.py [--devices 4] [--rounds 3] [--examples 1024]

On the same devices and the same data (the seed config and a synthetic TFRecord
file in the seed's format) it measures samples/s of
  (a) training steps: the real fit path (compiled model, tf.data pipeline, a
      callback with on_train_batch_end like RunLogger's);
  (b) kroberta.predict top_k, k=5, at the masked positions (the training head's
      work) and with positions="all";
  (c) Keras model.predict: the stock path, full head at the masked positions,
      returns logits (kept on the devices until the end);
  (d) the report's per-batch eager loop, model(x, training=False) per batch,
      each batch's logits fetched to the host;
in interleaved rounds, and prints medians and ratios to (a). Targets on 4
simulated CPU devices: (b)/(a) >= 2.5, (b)/(d) >= 4, (b) >= (c).
"""

import argparse
import os
import statistics
import tempfile
import time

from bench_common import fit_samples_per_second, simulate_cpu_devices


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--devices", type=int, default=4, help="simulated CPU devices (set before jax)")
    p.add_argument("--config", default="seed", help="a shipped config name or a TOML file")
    p.add_argument("--batch", type=int, default=64, help="global batch (all devices)")
    p.add_argument("--examples", type=int, default=1024, help="examples predicted per run")
    p.add_argument("--train-steps", type=int, default=12, help="timed training steps per round")
    p.add_argument("--rounds", type=int, default=3)
    return p.parse_args()


def main():
    args = parse_args()
    simulate_cpu_devices(args.devices)

    import dataclasses

    import numpy as np

    import kroberta
    from kroberta.config import config_path, load_toml
    from kroberta.data import pipeline
    from kroberta.data.synthetic import write_seed_format
    from kroberta.model.mlm import build_compiled_model
    from kroberta.parallel import distribute
    from kroberta.perf.plan import for_local_devices, make_plan

    tmp = tempfile.mkdtemp(prefix="bench_predict_")
    path = os.path.join(tmp, "seed.tfrecord")
    config = load_toml(config_path(args.config))
    L, V = config.model.max_sequence_length, config.model.vocabulary_size
    write_seed_format(path, max(args.examples, 4 * args.batch), L, V, seed=1)
    predict_path = os.path.join(tmp, "predict.tfrecord")
    write_seed_format(predict_path, args.examples, L, V, seed=2)
    config = dataclasses.replace(
        config,
        run_dir=tmp,
        data=dataclasses.replace(config.data, train=(path,)),
        train=dataclasses.replace(
            config.train, batch_size_per_device=args.batch // args.devices, steps=10**6
        ),
    )
    topology = distribute.setup(config.distributed, config.model)
    batch = make_plan(config, topology=topology).global_batch
    spec = pipeline.inspect_files(config.data.train, "data.train")
    train_ds = pipeline.train_dataset(spec, config.data, V, batch, config.train.seed)
    predict_spec = pipeline.inspect_files((predict_path,), "predict")
    eval_ds = pipeline.eval_dataset(predict_spec, config.data, V, batch, 0)
    x_ds = eval_ds.map(lambda x, y: x)
    model = build_compiled_model(for_local_devices(config))
    n = args.examples

    def train():
        return fit_samples_per_second(model, train_ds, args.train_steps, batch)

    def timed(fn):
        start = time.perf_counter()
        fn()
        return n / (time.perf_counter() - start)

    def eager_loop():
        for x, _ in eval_ds:
            np.asarray(model(x, training=False))

    cases = {
        "(a) train: fit": train,
        "(b) kroberta.predict top_k, masked": lambda: timed(
            lambda: kroberta.predict(model, predict_path, output="top_k", k=5)
        ),
        "(b') kroberta.predict top_k, all": lambda: timed(
            lambda: kroberta.predict(model, predict_path, output="top_k", k=5, positions="all")
        ),
        "(c) keras model.predict (logits)": lambda: timed(lambda: model.predict(x_ds, verbose=0)),
        "(d) eager loop model(x)": lambda: timed(eager_loop),
    }
    results = {name: [] for name in cases}
    print(f"warm-up (compiles every path) on {topology.describe()} ...", flush=True)
    for fn in cases.values():
        fn()
    for r in range(args.rounds):
        for name, fn in cases.items():
            results[name].append(fn())
        print(f"round {r + 1}: " + ", ".join(f"{v[-1]:.0f}" for v in results.values()), flush=True)

    med = {k: statistics.median(v) for k, v in results.items()}
    a = med["(a) train: fit"]
    print(
        f"\n{n} examples x {L} tokens, batch {batch}, {topology.num_devices} CPU device(s), "
        f"{args.rounds} rounds, medians"
    )
    print(f"{'path':40s} {'samples/s':>10s} {'x (a)':>7s}   rounds")
    for k, v in med.items():
        print(f"{k:40s} {v:10.1f} {v / a:7.2f}   {' '.join(f'{x:.0f}' for x in results[k])}")
    b = med["(b) kroberta.predict top_k, masked"]
    c, d = med["(c) keras model.predict (logits)"], med["(d) eager loop model(x)"]
    print(
        f"\ntargets: (b)/(a) = {b / a:.2f} (>= 2.5: {'met' if b / a >= 2.5 else 'MISSED'}); "
        f"(b)/(d) = {b / d:.2f} (>= 4: {'met' if b / d >= 4 else 'MISSED'}); "
        f"(b)/(c) = {b / c:.2f} (>= 1: {'met' if b >= c else 'MISSED'})"
    )


if __name__ == "__main__":
    main()

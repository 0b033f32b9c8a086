"""On a GPU or TPU: the seed config's training and prediction at K=1 and K="auto", against the floor.

    python tools/accelerator_check.py [--config seed] [--steps 400]
    python tools/accelerator_check.py --quick     # a few steps, any machine (CPU included)

One process, every local device, synthetic seed-format TFRecords. For each K
(train.steps_per_execution = 1 and the "auto" choice) it runs `kroberta.train`
for --steps steps and reads step_time, samples/s and MFU from metrics.jsonl (median
of the log intervals after the first, which holds the compilation), then
`kroberta.predict` top_k (k=5) over --predict-batches batches at one batch and at the
default batches per dispatch. "x floor" divides the measured time per step (batch)
by the compute floor: XLA's FLOPs of the compiled step (`kroberta.perf.aot_programs`, on
these devices) over the devices' peak (`kroberta.perf.throughput`). The last row is the
training input pipeline alone (`kroberta.data.pipeline.train_dataset`, no device).
Made to finish in under 6 minutes on one TPU or GPU host with the defaults.
"""

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="seed", help="a shipped config name or a TOML file")
    p.add_argument("--steps", type=int, default=400, help="training steps per K (>= 4 intervals)")
    p.add_argument("--predict-batches", type=int, default=400)
    p.add_argument("--records", type=int, default=8192, help="synthetic training records")
    p.add_argument("--mixed-precision", action="store_true", help="bf16 compute (TPU/GPU)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="8 steps, 8 predict batches, 512 records: checks the script anywhere",
    )
    args = p.parse_args()
    if args.quick:
        args.steps, args.predict_batches, args.records = 8, 8, 512
    return args


def _config(args, data_file, run_dir, k):
    from kroberta.config import config_path, load_toml

    config = load_toml(config_path(args.config))
    interval = max(1, args.steps // 4)  # four log intervals; "auto" divides it
    if k != "auto":
        interval = max(k, interval - interval % k)
    train = dataclasses.replace(
        config.train,
        steps=args.steps,
        warmup_steps=0,
        warmup_fraction=0.0,
        steps_per_execution=k,
        log_every=interval,
        eval_every=0,
        checkpoint_every=0,
        mixed_precision=args.mixed_precision or config.train.mixed_precision,
    )
    data = dataclasses.replace(config.data, train=(data_file,), validation=(), shuffle_buffer=1024)
    return dataclasses.replace(config, train=train, data=data, run_dir=run_dir)


def _train(config):
    from kroberta import train

    summary = train(config)
    with open(os.path.join(config.run_dir, "metrics.jsonl")) as f:
        rows = [r for r in map(json.loads, f) if r["split"] == "train" and "step_time" in r]
    timed = rows[1:] or rows  # the first interval holds the compilation
    if not timed:
        return None
    return {
        "step_time": statistics.median(r["step_time"] for r in timed),
        "samples_per_second": statistics.median(r["samples_per_second"] for r in timed),
        "mfu": statistics.median(r.get("mfu") or 0.0 for r in timed),
        "global_batch": summary["global_batch"],
    }


def _floors(config, devices, batch):
    """(train, predict) compute floors in seconds per step / batch on `devices`."""
    from kroberta.parallel import distribute
    from kroberta.perf import aot_programs, throughput

    model = aot_programs.build_model(config)
    distribution = distribute.make_distribution(config, devices)
    length = config.model.max_sequence_length
    slots = config.data.prediction_slots(length)
    train = aot_programs.compile_train(
        model, distribution, batch, length, slots, steps=1, step_input=config.data.step_input()
    )
    predict = aot_programs.compile_predict(model, devices, batch, length, slots, group=1)
    peak = throughput.peak_flops(devices)
    if not peak:
        return None, None
    # Program FLOPs are per device; the peak is all devices' together.
    return (train.flops * len(devices) / peak, predict.flops * len(devices) / peak)


def _predict(config, run_dir, batch, batches, group):
    import kroberta
    from kroberta.data.synthetic import make_sequences, mask_once
    from kroberta.inference import prediction

    model = kroberta.load(run_dir)
    rows = batch * batches

    tokens, mask = make_sequences(
        rows, config.model.max_sequence_length, config.model.vocabulary_size, seed=5
    )
    masked, _ = mask_once(tokens, mask, config.model.vocabulary_size, seed=5)
    inputs = {"input_ids": masked, "attention_mask": mask}
    prediction.predict(model, inputs, batches_per_dispatch=group)  # compiles
    start = time.perf_counter()
    prediction.predict(model, inputs, batches_per_dispatch=group)
    seconds = (time.perf_counter() - start) / batches
    return {"batch_time": seconds, "samples_per_second": batch / seconds, "batch": batch}


def _pipeline_rate(config, data_file, batch, batches):
    from kroberta.data import pipeline

    spec = pipeline.inspect_files((data_file,), "data.train")
    ds = pipeline.train_dataset(
        spec,
        config.data,
        config.model.vocabulary_size,
        batch,
        config.train.seed,
        0,
        device_masks=True,
    )  # as training reads it
    iterator = iter(ds)
    next(iterator)
    start = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    return batches * batch / (time.perf_counter() - start)


def main():
    args = parse_args()
    started = time.perf_counter()
    # kroberta's modules first: importing the package fixes Keras' backend and XLA's flags
    # before JAX starts.
    import jax

    from kroberta.data.synthetic import write_seed_format
    from kroberta.perf.plan import make_plan

    work = tempfile.mkdtemp(prefix="accelerator-check-")
    base = _config(args, "", "", 1)
    data_file = os.path.join(work, "train.tfrecord")
    write_seed_format(
        data_file, args.records, base.model.max_sequence_length, base.model.vocabulary_size, seed=1
    )
    devices = jax.devices()
    print(
        f"{len(devices)} x {devices[0].device_kind} ({devices[0].platform}); jax "
        f"{jax.__version__}; {args.steps} training steps and {args.predict_batches} "
        "prediction batches per setting",
        flush=True,
    )

    results = {}
    for k in (1, "auto"):
        config = _config(args, data_file, os.path.join(work, f"run-k{k}"), k)
        results[k] = _train(config)
        results[k]["k"] = make_plan(config, devices).steps_per_dispatch
    config = _config(args, data_file, os.path.join(work, "run-k1"), 1)
    batch = results[1]["global_batch"]
    slots = config.data.prediction_slots(config.model.max_sequence_length)
    auto_group = make_plan(
        dataclasses.replace(
            config, train=dataclasses.replace(config.train, steps_per_execution="auto")
        ),
        devices,
        config.model.max_sequence_length,
        strategy="data",
    ).prediction_group(batch, slots, batch * args.predict_batches)
    predicted = {
        g: _predict(config, os.path.join(work, "run-k1"), batch, args.predict_batches, g)
        for g in (1, auto_group)
    }
    train_floor, predict_floor = _floors(config, devices, batch)
    pipeline_rate = _pipeline_rate(config, data_file, batch, max(8, args.steps // 4))

    def ratio(seconds, floor):
        return f"{seconds / floor:.1f}" if floor else "n/a"

    print("\n| path | K (per dispatch) | ms per step or batch | samples/s | MFU | x floor |")
    print("|---|---|---|---|---|---|")
    for k in (1, "auto"):
        r = results[k]
        print(
            f"| train, steps_per_execution={k} | {r['k']} | {r['step_time'] * 1e3:.3f} | "
            f"{r['samples_per_second']:,.0f} | {r['mfu']:.1%} | "
            f"{ratio(r['step_time'], train_floor)} |"
        )
    for g, r in predicted.items():
        print(
            f"| predict top_k, batches_per_dispatch={g} | {g} | {r['batch_time'] * 1e3:.3f} | "
            f"{r['samples_per_second']:,.0f} | | {ratio(r['batch_time'], predict_floor)} |"
        )
    print(
        f"| input pipeline alone (train_dataset) | | {batch / pipeline_rate * 1e3:.3f} | "
        f"{pipeline_rate:,.0f} | | |"
    )
    if train_floor:
        print(
            f"\nfloor: {train_floor * 1e3:.4f} ms per training step, {predict_floor * 1e3:.4f} "
            f"ms per prediction batch (batch {batch}); "
            f"ran in {time.perf_counter() - started:.0f} s"
        )


if __name__ == "__main__":
    main()

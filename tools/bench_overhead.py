"""Host overhead per step: kroberta's training and prediction against bare compiled loops.

    python tools/bench_overhead.py [--steps-per-execution 32] [--dispatches 40] [--rounds 3]

One process, one CPU device, a micro model (1 layer, hidden 16, 16 tokens, batch 8),
where the compiled work per step is so small that what is left is the host's:
  train  `kroberta.train` at train.steps_per_execution = K (its step_time in
         metrics.jsonl, the median over the log intervals after the first, which
         holds the compilation), against the same K-step program
         (`kroberta.model.super_batch.scan_steps` of the training model's train_step) called in a
         Python loop on super-batches already on the device, and the same loop reading
         each super-batch from kroberta's tf.data pipeline (what the input costs when it
         shares the CPU with the compute, as on this benchmark's CPU device);
  predict `kroberta.predict` top_k (k=5) on numpy arrays, per batch, against the
         same jitted program (`kroberta.model.predict_program.make_predict_step`: slots, forward,
         top_k; one batch per call) in a Python loop over batches already on the device.
Rounds interleave the systems; the table gives medians, best rounds and the ratios to the
bare loops (on a shared machine the best rounds are the least disturbed).
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps-per-execution", type=int, default=32, help="K for training")
    p.add_argument("--dispatches", type=int, default=40, help="training dispatches per round")
    p.add_argument("--predict-batches", type=int, default=512, help="batches predicted per round")
    p.add_argument("--rounds", type=int, default=3)
    return p.parse_args()


def micro_config(data_file: str, run_dir: str, k: int, dispatches: int):
    from kroberta.config import Config, DataConfig, ModelConfig, TrainConfig

    model = ModelConfig(
        vocabulary_size=512,
        num_layers=1,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        max_sequence_length=16,
    )
    steps = k * dispatches
    train = TrainConfig(
        batch_size_per_device=8,
        steps=steps,
        warmup_steps=0,
        warmup_fraction=0.0,
        steps_per_execution=k,
        log_every=k * 5,
        eval_every=0,
        checkpoint_every=0,
        learning_rate=1e-3,
    )
    data = DataConfig(train=(data_file,), shuffle_buffer=64, mask_rate=0.15)  # the measured rate
    return Config(model=model, data=data, train=train, run_dir=run_dir)


def kroberta_train_step_seconds(config) -> float:
    from kroberta import train

    train(config)
    with open(os.path.join(config.run_dir, "metrics.jsonl")) as f:
        rows = [r for r in map(json.loads, f) if r["split"] == "train" and "step_time" in r]
    # The first row's interval holds the first dispatch (compiling); it is left out.
    return statistics.median(r["step_time"] for r in rows[1:])


def bare_scan_step_seconds(config, spec, read_input: bool = False) -> float:
    """The K-step program kroberta runs, dispatched from a Python loop, inputs on device;
    with `read_input`, each dispatch's super-batch read from the same tf.data pipeline
    (batched by K in tf.data, as numpy, then `jax.device_put`) as a hand-written loop would."""
    import jax
    import numpy as np

    from kroberta.data import pipeline
    from kroberta.model.mlm import build_compiled_model
    from kroberta.model.super_batch import scan_steps

    t = config.train
    model = build_compiled_model(config)
    ds = pipeline.train_dataset(
        spec,
        config.data,
        config.model.vocabulary_size,
        t.batch_size_per_device,
        t.seed,
        0,
        device_masks=True,
    )
    flat = list(ds.take(t.steps_per_execution).as_numpy_iterator())
    super_batch = jax.tree.map(lambda *a: np.stack(a), *flat)  # (K, B, ...)
    # The state train_step takes, as Keras' JAX trainer gathers it for `fit`.
    state = tuple(
        [v.value for v in variables]
        for variables in (
            model.trainable_variables,
            model.non_trainable_variables,
            model.optimizer.variables,
            model.metrics_variables,
        )
    )
    program = jax.jit(scan_steps(model.train_step), donate_argnums=0)
    on_device = jax.device_put(super_batch)
    # Compiles; twice where the first call's outputs come back on other shardings than
    # its inputs (a weight left on its device's own sharding): the timed loop compiles nothing.
    for _ in range(2):
        logs, state = program(state, on_device)
    jax.block_until_ready(state)
    dispatches = t.steps // t.steps_per_execution
    if read_input:
        stream = ds.batch(t.steps_per_execution).prefetch(2).as_numpy_iterator()
        next(stream)  # the pipeline started and its buffers filled, as kroberta's are
    start = time.perf_counter()
    for _ in range(dispatches):
        logs, state = program(state, jax.device_put(next(stream)) if read_input else on_device)
    jax.block_until_ready(state)
    return (time.perf_counter() - start) / (dispatches * t.steps_per_execution)


def predict_inputs(config, batches: int, batch: int):
    import numpy as np

    rng = np.random.default_rng(0)
    n, length = batches * batch, config.model.max_sequence_length
    ids = rng.integers(5, config.model.vocabulary_size, (n, length)).astype(np.int32)
    ids[:, 0], ids[:, -1] = 0, 2
    masked = rng.random((n, length)) < 0.15
    masked[:, [0, -1]] = False
    ids[masked] = config.data.mask_token_id
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


def kroberta_predict_batch_seconds(model, inputs, batches: int) -> float:
    from kroberta.inference import prediction

    prediction.predict(model, inputs, output="top_k", k=5)  # compiles (cached after)
    start = time.perf_counter()
    prediction.predict(model, inputs, output="top_k", k=5)
    return (time.perf_counter() - start) / batches


def bare_predict_batch_seconds(model, config, batches: int, batch: int) -> float:
    import jax
    import numpy as np

    from kroberta.model.predict_program import make_predict_step, weights_snapshot

    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("batch",))
    length, slots = config.model.max_sequence_length, config.data.prediction_slots(16)
    step, in_shardings, out_shardings = make_predict_step(model, "top_k", 5, mesh, slots)
    jitted = jax.jit(step, in_shardings=in_shardings, out_shardings=out_shardings)
    weights = weights_snapshot(model, in_shardings[0])
    rng = np.random.default_rng(1)
    ids = rng.integers(5, 500, (batch, length)).astype(np.int32)
    masked = rng.random((batch, length)) < 0.15
    one = {
        "token_ids": ids,
        "padding_mask": np.ones((batch, length), np.int32),
        "marks": np.where(masked, config.data.mask_token_id, -100).astype(np.int32),
    }
    on_device = jax.device_put(one, in_shardings[2])
    jax.block_until_ready(jitted(*weights, on_device))
    start = time.perf_counter()
    outs = [jitted(*weights, on_device) for _ in range(batches)]
    jax.block_until_ready(outs)
    return (time.perf_counter() - start) / batches


def main():
    args = parse_args()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import kroberta  # noqa: F401  (fixes the backend before keras is imported)
    from kroberta.data import pipeline
    from kroberta.data.synthetic import write_seed_format
    from kroberta.model.mlm import build_compiled_model

    k = args.steps_per_execution
    work = tempfile.mkdtemp(prefix="bench-overhead-")
    data_file = os.path.join(work, "train.tfrecord")
    write_seed_format(data_file, 4096, 16, 512, seed=1)
    config = micro_config(data_file, os.path.join(work, "run"), k, args.dispatches)
    spec = pipeline.inspect_files((data_file,), "data.train")
    batch = config.train.batch_size_per_device
    predict_model = build_compiled_model(config)
    inputs = predict_inputs(config, args.predict_batches, batch)

    results = {"train": [], "scan": [], "scan+input": [], "predict": [], "loop": []}
    for round_ in range(args.rounds):
        run = micro_config(data_file, os.path.join(work, f"run{round_}"), k, args.dispatches)
        results["train"].append(kroberta_train_step_seconds(run))
        results["scan"].append(bare_scan_step_seconds(run, spec))
        results["scan+input"].append(bare_scan_step_seconds(run, spec, read_input=True))
        results["predict"].append(
            kroberta_predict_batch_seconds(predict_model, inputs, args.predict_batches)
        )
        results["loop"].append(
            bare_predict_batch_seconds(predict_model, config, args.predict_batches, batch)
        )
        print(
            f"round {round_ + 1}: "
            + ", ".join(f"{n} {v[-1] * 1e6:.0f} us" for n, v in results.items()),
            flush=True,
        )

    med = {n: statistics.median(v) for n, v in results.items()}
    best = {n: min(v) for n, v in results.items()}
    print(
        f"\nmicro model (1 layer, hidden 16, 16 tokens, batch {batch}), 1 CPU device, "
        f"K = {k}; {args.rounds} rounds; load average {os.getloadavg()[0]:.1f} at the end"
    )
    print(
        "| path | per step or batch, median | best round | x bare (medians) | x bare (best rounds) |"
    )
    print("|---|---|---|---|---|")
    rows = [
        (f"`kroberta.train` step_time, steps_per_execution={k}", "train", "scan"),
        (
            f"bare: the same {k}-step program in a Python loop, super-batch on device",
            "scan",
            "scan",
        ),
        ("bare, each super-batch read from the same tf.data pipeline", "scan+input", "scan"),
        ("`kroberta.predict` top_k (k=5), per batch", "predict", "loop"),
        ("bare: the jitted forward + top_k in a Python loop, batch on device", "loop", "loop"),
    ]
    for name, ours, base in rows:
        print(
            f"| {name} | {med[ours] * 1e6:,.0f} us | {best[ours] * 1e6:,.0f} us | "
            f"{med[ours] / med[base]:.2f} | {best[ours] / best[base]:.2f} |"
        )
    print(
        f"\nkroberta.train against the bare loop that reads the same input: "
        f"{med['train'] / med['scan+input']:.2f}x (medians), "
        f"{best['train'] / best['scan+input']:.2f}x (best rounds)"
    )


if __name__ == "__main__":
    main()

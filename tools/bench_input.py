"""The host input pipeline alone: samples/s of kroberta's pipelines against the report's own.

    python tools/bench_input.py [--records 20000] [--batch 64] [--rounds 5]

One process, the same seed-format file (input_ids, attention_mask, labels; 64 tokens),
then the same at 512 tokens, no model:
  (a) report     the report's pipeline as written: TFRecordDataset(files)
                 .map(decode_fn).batch(64), one `parse_single_example` per record,
                 no checks, no masking, no prefetch
  (b) train      kroberta.data.pipeline.train_dataset (seed.toml's data settings), static
                 labels, as training feeds it: the file's labels per position, from which
                 the training step chooses the slots
  (b') host      the same with the slots chosen here, in the pipeline (the step's JAX
                 function on the host CPU; `kroberta.dataset(..., masks_on_host=True)`)
  (c) dynamic    the same with dynamic masking, as training feeds it: unmasked batches
                 with mask keys, whose masks the training step draws on the device
  (c') host      the same dynamic masks drawn here, in the pipeline (the step's JAX
                 function on the host CPU; `kroberta.dataset(..., masks_on_host=True)`)
  (d) predict    kroberta.predict's input path for TFRecords (read, check, marks,
                 padding), as numpy batches, without the model
  (e) eval       kroberta.data.pipeline.eval_dataset, dynamic masking, as training
                 evaluates (masks drawn by the step); (e') with the masks drawn here
Below the table: what the masks cost where (c) moved them, the jitted masking of one
batch (`kroberta.masking.masker`) on this host's first JAX device. With
--host-records-per-call N1 N2 ..., only (b') (c') (e') instead, side by side with N1,
N2 ... records per call of their map.
Each round reads --batches batches after a warm-up batch; the table gives the median
round and the ratio to (a)'s median. Rounds alternate between the pipelines, so a
busy moment of the shared machine hits all of them.

Each pipeline is measured twice: as built (tf.data's own thread pool, all cores)
and on one thread (a private pool of one, no intra-op parallelism). The second is
the work per record, the same on any host and least disturbed by other jobs; the
first is what this host's cores give (a host with more cores scales kroberta's
batched map, not (a)'s sequential one).
"""

import argparse
import dataclasses
import os
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--records", type=int, default=20000, help="records in the 64-token file")
    p.add_argument("--long-records", type=int, default=4000, help="records in the 512-token file")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--batches", type=int, default=150, help="timed batches per round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--config", default="seed", help="a shipped config name or a TOML file")
    p.add_argument(
        "--lengths",
        type=int,
        nargs="+",
        default=[64, 512],
        help="sequence lengths to measure (64 uses --records, others --long-records)",
    )
    p.add_argument(
        "--host-records-per-call",
        type=int,
        nargs="+",
        metavar="N",
        help="instead: the host-masked pipelines (b') (c') (e') side by side with "
        "N records per call of their map (pipeline.HOST_MASKED_RECORDS_PER_CALL)",
    )
    return p.parse_args()


def report_pipeline(files, length):
    import tensorflow as tf

    spec = {
        name: tf.io.FixedLenFeature([length], tf.int64)
        for name in ("input_ids", "attention_mask", "labels")
    }

    def decode_fn(record):
        return tf.io.parse_single_example(record, spec)

    return lambda batch: tf.data.TFRecordDataset(files).map(decode_fn).batch(batch).repeat()


def kroberta_pipelines(files, config):
    from kroberta.data import pipeline
    from kroberta.inference import inputs

    spec = pipeline.inspect_files(files, "bench")
    V = config.model.vocabulary_size
    static = dataclasses.replace(config.data, masking="static")
    dynamic = dataclasses.replace(config.data, masking="dynamic")
    predict_config = dataclasses.replace(config, data=static)

    def predict(batch):
        source = inputs.as_examples(list(files), predict_config)
        return inputs._dataset_batches(source, predict_config, "masked", batch).repeat()

    return {
        "(b) train, static labels (slots chosen by the step)": lambda b: pipeline.train_dataset(
            spec, static, V, b, 0, device_masks=True
        ),
        "(b') train, static slots chosen on the host": lambda b: pipeline.train_dataset(
            spec, static, V, b, 0
        ),
        "(c) train, dynamic masking (masks drawn by the step)": lambda b: pipeline.train_dataset(
            spec, dynamic, V, b, 0, device_masks=True
        ),
        "(c') train, dynamic masks drawn on the host": lambda b: pipeline.train_dataset(
            spec, dynamic, V, b, 0
        ),
        "(d) predict inputs": predict,
        "(e) eval (masks drawn by the step)": lambda b: pipeline.eval_dataset(
            spec, dynamic, V, b, 0, device_masks=True
        ).repeat(),
        "(e') eval, masks drawn on the host": lambda b: pipeline.eval_dataset(
            spec, dynamic, V, b, 0
        ).repeat(),
    }


def device_masking_seconds(length, config, batch, repeats=50):
    """Median seconds of the jitted dynamic masking of one (batch, length) batch on this
    host's first JAX device: the work (c) leaves to the training step."""
    import jax
    import numpy as np

    from kroberta import masking

    rng = np.random.default_rng(0)
    V = config.model.vocabulary_size
    x = {
        "token_ids": rng.integers(5, V, (batch, length)).astype(np.int32),
        "padding_mask": np.ones((batch, length), np.int32),
        "mask_keys": rng.integers(0, 2**32, batch, dtype=np.uint32),
    }
    x = jax.device_put(x)
    mask = jax.jit(masking.masker(config.data, V))
    jax.block_until_ready(mask(x))
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        jax.block_until_ready(mask(x))
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def one_thread(dataset):
    import tensorflow as tf

    options = tf.data.Options()
    options.threading.private_threadpool_size = 1
    options.threading.max_intra_op_parallelism = 1
    return dataset.with_options(options)


def rate(make, batch, batches, threads):
    """Samples/s reading `batches` batches after one warm-up batch."""
    dataset = make(batch)
    iterator = iter(one_thread(dataset) if threads == 1 else dataset)
    next(iterator)
    started = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    return batch * batches / (time.perf_counter() - started)


def measure(files, length, config, args):
    pipelines = {"(a) report's pipeline": report_pipeline(files, length)}
    pipelines.update(kroberta_pipelines(files, config))
    rounds = {(name, threads): [] for name in pipelines for threads in ("all", 1)}
    for _ in range(args.rounds):
        for name, make in pipelines.items():
            for threads in ("all", 1):
                rounds[name, threads].append(rate(make, args.batch, args.batches, threads))
    medians = {key: statistics.median(r) for key, r in rounds.items()}
    base = {threads: medians["(a) report's pipeline", threads] for threads in ("all", 1)}
    print(f"\n{length} tokens, batch {args.batch}, {args.rounds} rounds x {args.batches} batches")
    print(
        "| pipeline | samples/s (median) | best round | x (a) | one thread: samples/s | x (a) |\n"
        "|---|---|---|---|---|---|"
    )
    for name in pipelines:
        value, single = medians[name, "all"], medians[name, 1]
        print(
            f"| {name} | {value:,.0f} | {max(rounds[name, 'all']):,.0f} | "
            f"{value / base['all']:.2f}x | {single:,.0f} | {single / base[1]:.2f}x |"
        )
    seconds = device_masking_seconds(length, config, args.batch)
    print(
        f"\n(c)'s masks in the step, on this host's CPU device: {seconds * 1e3:.2f} ms per "
        f"batch of {args.batch} ({seconds / args.batch * 1e6:.1f} us per sample)"
    )


def measure_host_records_per_call(files, length, config, args):
    """(b') (c') (e') built with each of `args.host_records_per_call` records per map call,
    rounds alternating between them; the median samples/s and the ratio to the first."""
    from kroberta.data import pipeline

    host = {
        name: make
        for name, make in kroberta_pipelines(files, config).items()
        if name[:4] in ("(b')", "(c')", "(e')")
    }

    def with_records(make, records):
        def built(batch):
            default = pipeline.HOST_MASKED_RECORDS_PER_CALL
            pipeline.HOST_MASKED_RECORDS_PER_CALL = records
            try:
                return make(batch)
            finally:
                pipeline.HOST_MASKED_RECORDS_PER_CALL = default

        return built

    counts = args.host_records_per_call
    rounds = {}
    for _ in range(args.rounds):
        for name, make in host.items():
            for records in counts:
                for threads in ("all", 1):
                    rounds.setdefault((name, records, threads), []).append(
                        rate(with_records(make, records), args.batch, args.batches, threads)
                    )
    medians = {key: statistics.median(r) for key, r in rounds.items()}
    print(
        f"\n{length} tokens, batch {args.batch}, {args.rounds} rounds x {args.batches} batches: "
        "samples/s (all threads / one thread), x the first"
    )
    print(
        "| pipeline | " + " | ".join(f"{n} records per call" for n in counts) + " |\n"
        "|---|" + "---|" * len(counts)
    )
    for name in host:
        cells = []
        for records in counts:
            both = [medians[name, records, t] for t in ("all", 1)]
            first = [medians[name, counts[0], t] for t in ("all", 1)]
            cells.append(
                " / ".join(f"{v:,.0f}" for v in both)
                + (
                    ""
                    if records == counts[0]
                    else " (" + " / ".join(f"{v / f:.2f}x" for v, f in zip(both, first)) + ")"
                )
            )
        print(f"| {name} | " + " | ".join(cells) + " |")


def main():
    args = parse_args()
    import kroberta  # noqa: F401  (the backend and TF's device set-up)
    from kroberta.config import load_config
    from kroberta.data.synthetic import write_seed_format

    config = load_config(args.config)
    V = config.model.vocabulary_size
    with tempfile.TemporaryDirectory() as tmp:
        for length in args.lengths:
            records = args.records if length <= 64 else args.long_records
            path = os.path.join(tmp, f"seed-{length}.tfrecords")
            write_seed_format(path, records, length, V, seed=1)
            model = dataclasses.replace(config.model, max_sequence_length=length)
            at_length = dataclasses.replace(config, model=model)
            if args.host_records_per_call:
                measure_host_records_per_call([path], length, at_length, args)
            else:
                measure([path], length, at_length, args)


if __name__ == "__main__":
    main()

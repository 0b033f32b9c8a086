"""The host input pipeline alone: samples/s of kroberta's pipelines against the report's own.

    python tools/bench_input.py [--records 20000] [--batch 64] [--rounds 5]

One process, the same seed-format file (input_ids, attention_mask, labels; 64 tokens),
then the same at 512 tokens, no model:
  (a) report     the report's pipeline as written: TFRecordDataset(files)
                 .map(decode_fn).batch(64), one `parse_single_example` per record,
                 no checks, no masking, no prefetch
  (b) train      kroberta.data.pipeline.train_dataset (seed.toml's data settings), static labels
  (c) dynamic    the same with dynamic masking
  (d) predict    kroberta.predict's input path for TFRecords (read, check, slots,
                 padding), as numpy batches, without the model
  (e) eval       kroberta.data.pipeline.eval_dataset
Each round reads --batches batches after a warm-up batch; the table gives the median
round and the ratio to (a)'s median. Rounds alternate between the pipelines, so a
busy moment of the shared machine hits all of them.
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
    return p.parse_args()


def report_pipeline(files, length):
    import tensorflow as tf

    spec = {name: tf.io.FixedLenFeature([length], tf.int64)
            for name in ("input_ids", "attention_mask", "labels")}

    def decode_fn(record):
        return tf.io.parse_single_example(record, spec)

    return lambda batch: tf.data.TFRecordDataset(files).map(decode_fn).batch(batch).repeat()


def kroberta_pipelines(files, config):
    from kroberta.data import pipeline as data_lib
    from kroberta.inference import inputs as prediction_inputs

    spec = data_lib.inspect_files(files, "bench")
    V = config.model.vocabulary_size
    static = dataclasses.replace(config.data, masking="static")
    dynamic = dataclasses.replace(config.data, masking="dynamic")
    predict_config = dataclasses.replace(config, data=static)

    def predict(batch):
        source = prediction_inputs.as_examples(list(files), predict_config)
        slots = config.data.prediction_slots(spec.sequence_length)
        return prediction_inputs._dataset_batches(source, predict_config, slots, "masked",
                                                  batch).repeat()

    return {
        "(b) train, static labels": lambda b: data_lib.train_dataset(spec, static, V, b, 0),
        "(c) train, dynamic masking": lambda b: data_lib.train_dataset(spec, dynamic, V, b, 0),
        "(d) predict inputs": predict,
        "(e) eval": lambda b: data_lib.eval_dataset(spec, dynamic, V, b, 0).repeat(),
    }


def rate(make, batch, batches):
    """Samples/s reading `batches` batches after one warm-up batch."""
    iterator = iter(make(batch))
    next(iterator)
    started = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    return batch * batches / (time.perf_counter() - started)


def measure(files, length, config, args):
    pipelines = {"(a) report's pipeline": report_pipeline(files, length)}
    pipelines.update(kroberta_pipelines(files, config))
    rounds = {name: [] for name in pipelines}
    for _ in range(args.rounds):
        for name, make in pipelines.items():
            rounds[name].append(rate(make, args.batch, args.batches))
    medians = {name: statistics.median(r) for name, r in rounds.items()}
    base = medians["(a) report's pipeline"]
    print(f"\n{length} tokens, batch {args.batch}, {args.rounds} rounds x {args.batches} batches")
    print("| pipeline | samples/s (median) | best round | x (a) |\n|---|---|---|---|")
    for name, value in medians.items():
        print(f"| {name} | {value:,.0f} | {max(rounds[name]):,.0f} | {value / base:.2f}x |")


def main():
    args = parse_args()
    import kroberta  # noqa: F401  (the backend and TF's device set-up)
    from kroberta.named_configs import load_config
    from kroberta.data.synthetic import write_seed_format

    config = load_config(args.config)
    V = config.model.vocabulary_size
    with tempfile.TemporaryDirectory() as tmp:
        for length, records in ((64, args.records), (512, args.long_records)):
            path = os.path.join(tmp, f"seed-{length}.tfrecords")
            write_seed_format(path, records, length, V, seed=1)
            model = dataclasses.replace(config.model, max_sequence_length=length)
            measure([path], length, dataclasses.replace(config, model=model), args)


if __name__ == "__main__":
    main()

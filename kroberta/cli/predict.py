"""Predict from the command line, streaming to an .npz file with bounded host memory.

    python -m kroberta.predict --run runs/seed --data 'x/*.tfrecords' --output top_k --k 5 --out preds.npz

The results stream into the .npz as `kroberta.inference.npz_file` writes it: an
interrupted run, a kill or a full disk leaves no partial file. A full disk or a
read-only folder is one line naming --out and the free space, exit 2.

The Python API is `kroberta.predict(...)` (kroberta/inference/prediction.py).
"""

import os
import sys
import warnings

import kroberta
from kroberta import cli, console, storage
from kroberta.data.file_patterns import resolve_files
from kroberta.errors import InputError
from kroberta.inference import DEFAULT_MAX_OUTPUT_BYTES, OUTPUTS
from kroberta.inference.npz_file import write_npz
from kroberta.run_layout import CLASSIFIER, model_source

# The prediction engine (JAX, Keras, TensorFlow) is imported when it is used, so that
# `--help` and argument errors answer at once.


def _parser():
    p = cli.ArgumentParser(prog="python -m kroberta.predict", description=__doc__.split("\n")[0])
    p.add_argument(
        "--run",
        required=True,
        help="the masked LM: a training run, a Hugging Face "
        "directory or a keras-hub preset (kroberta.load)",
    )
    p.add_argument(
        "--data", required=True, action="append", help="TFRecord file or glob (repeatable)"
    )
    p.add_argument(
        "--output",
        default="top_k",
        choices=OUTPUTS,
        help="what to compute on the device: top_k candidates (default), logits, "
        "the loss per sequence, or embeddings",
    )
    p.add_argument("--k", type=int, default=5, help="candidates per position for top_k")
    p.add_argument(
        "--positions",
        default="masked",
        choices=("masked", "all"),
        help="predict at the <mask> (or labelled) positions (default), or at all",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        help="sequences per step, all devices (default: the training batch)",
    )
    p.add_argument(
        "--slots",
        type=int,
        help="prediction slots per sequence (default: the training config's)",
    )
    p.add_argument(
        "--max-output-gib",
        type=float,
        default=DEFAULT_MAX_OUTPUT_BYTES / 2**30,
        help="refuse output='logits' larger than this (GiB of float32)",
    )
    p.add_argument("--out", required=True, help="the .npz file to write")
    p.add_argument("--no-progress", action="store_true", help="no progress line")
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    return cli.run(
        lambda: _main(args),
        interrupted="interrupted; nothing was written",
        also=(FileNotFoundError,),
        when_out_of_memory="--batch-size",
    )


def _main(args) -> int:
    # Every check before the prediction engine is imported: a mistake is named at once.
    if not args.out.endswith(".npz"):
        raise InputError(f"--out: {args.out!r} must end with .npz")
    # Where the file goes is checked before the prediction's work, not after it.
    folder = os.path.dirname(args.out)
    if not storage.is_url(args.out) and not os.path.isdir(os.path.abspath(folder)):
        raise InputError(
            f"--out: the folder {folder!r} does not exist; create it first (mkdir -p {folder})"
        )
    storage.check_writable(args.out, "--out")  # a URL: an object written there and removed
    if model_source(args.run, "--run")[1] == CLASSIFIER:
        raise InputError(
            f"--run: {args.run} is a fine-tuned classifier, not a masked LM; "
            f"predict its labels with python -m kroberta.finetune --classifier "
            f"{args.run} --predict FILE --predictions OUT.jsonl"
        )
    files = resolve_files(args.data, "--data")
    from kroberta.inference import prediction  # start-up time: after the checks

    model = kroberta.load(args.run)
    chunks = prediction.predict_batches(
        model,
        args.data,
        output=args.output,
        k=args.k,
        positions=args.positions,
        batch_size=args.batch_size,
        slots=args.slots,
        max_output_bytes=int(args.max_output_gib * 2**30),
    )
    from kroberta.data.pipeline import inspect_files  # start-up time: after the checks

    total = inspect_files(files, "--data").records
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        progress = console.Progress(total, "predict", enabled=not args.no_progress, unit="examples")
        # The raw files beside --out, then the archive: a failed write leaves neither.
        with storage.writing(
            args.out,
            "predictions",
            then="nothing was written; free some space or choose another "
            "--out, and run the same command again",
        ):
            shapes = write_npz(chunks, args.out, progress)
    for warning in caught:
        print(f"warning: {warning.message}", file=sys.stderr)
    summary = ", ".join(f"{name} {list(shape)}" for name, shape in shapes.items())
    print(f"wrote {args.out}: {summary}")
    return 0

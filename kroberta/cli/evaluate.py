"""Evaluate a model's masked-LM loss on prepared data, as training's validation does.

    python -m kroberta.evaluate --model runs/x --data data/man
    python -m kroberta.evaluate --model hf_model/ --data 'data/man/validation-*.tfrecord' --json

--model is a training run, a Hugging Face RoBERTa directory or a keras-hub preset
directory; --data a prepared directory (its validation split) or TFRecord file(s).
The numbers are those a training run logs for its validation (the same masks, from
the same seed): the baseline to compare a continued run with.
The Python API is `kroberta.evaluate(model, data)` (kroberta/training/evaluation.py).
"""

import json

from kroberta import cli, storage
from kroberta.data.file_patterns import resolve_files
from kroberta.data.manifest import load_manifest
from kroberta.run_layout import MASKED_LM, MODEL_KINDS, model_source

# JAX, Keras and TensorFlow are imported when the model is loaded, so that `--help` and
# argument errors answer at once.


def _parser():
    p = cli.ArgumentParser(prog="python -m kroberta.evaluate", description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help=MODEL_KINDS)
    p.add_argument(
        "--data",
        required=True,
        action="append",
        help="a prepared directory (its validation split) or TFRecord file/glob (repeatable)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        help="sequences per step, all devices (default: the model's config's)",
    )
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    return p


def _table(model: str, data: list[str], result: dict) -> str:
    rows = [
        ("model", model),
        ("data", " ".join(data)),
        ("sequences", f"{result['sequences']:,}"),
        ("loss", f"{result['loss']:.4f}"),
        ("masked_accuracy", f"{result['masked_accuracy']:.4f}"),
        ("perplexity", f"{result['perplexity']:.2f}"),
    ]
    return "\n".join(f"{name:<16} {value}" for name, value in rows)


def _check_data(data: list[str]):
    """A prepared directory holds its manifest; files and globs match something."""
    if len(data) == 1 and storage.isdir(data[0]):
        load_manifest(data[0])
    else:
        resolve_files(data, "--data")


def main(argv=None) -> int:
    args = _parser().parse_args(argv)

    def body():
        # The paths, checked before JAX, Keras and TensorFlow are imported: a mistake at once.
        model_source(args.model, "--model", head=MASKED_LM)
        _check_data(args.data)
        # start-up: JAX and the model load after the arguments were checked
        from kroberta.downstream.model_files import load  # start-up time: after the checks
        from kroberta.training.evaluation import evaluate

        data = args.data[0] if len(args.data) == 1 else args.data
        result = evaluate(load(args.model), data, batch_size=args.batch_size)
        print(
            json.dumps({"model": args.model, "data": args.data, **result})
            if args.json
            else _table(args.model, args.data, result)
        )

    return cli.run(body, when_out_of_memory="--batch-size")

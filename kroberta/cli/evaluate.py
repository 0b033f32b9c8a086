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
import os
import sys

from kroberta import cli
from kroberta.errors import InputError

# JAX, Keras and TensorFlow are imported when the model is loaded, so that `--help` and
# argument errors answer at once.

WHAT = "a training run, a Hugging Face RoBERTa directory or a keras-hub preset directory"


def _parser():
    p = cli.ArgumentParser(prog="python -m kroberta.evaluate", description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help=WHAT)
    p.add_argument("--data", required=True, action="append",
                   help="a prepared directory (its validation split) or TFRecord file/glob "
                   "(repeatable)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="sequences per step, all devices (default: the model's config's)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    return p


def load_model(path: str):
    """The model at `path`: `kroberta.load` for a run directory (config.toml),
    `from_hf` for a Hugging Face directory (config.json with a model_type),
    `from_keras_hub` for a keras-hub preset (config.json naming its backbone class)."""
    import kroberta

    if not os.path.isdir(path):
        raise InputError(f"--model: {path!r} is not a directory; give {WHAT}")
    if os.path.isfile(os.path.join(path, "config.toml")):
        return kroberta.load(path)
    try:
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            described = json.load(f)
    except (OSError, ValueError):
        described = None
    if isinstance(described, dict) and "model_type" in described:
        return kroberta.from_hf(path)
    if isinstance(described, dict) and "registered_name" in described:
        return kroberta.from_keras_hub(path)
    raise InputError(f"--model: {path} holds neither config.toml (a training run) nor a "
                     "config.json of a Hugging Face model or keras-hub preset; give " + WHAT)


def _table(model: str, data: list[str], result: dict) -> str:
    rows = [("model", model), ("data", " ".join(data)), ("sequences", f"{result['sequences']:,}"),
            ("loss", f"{result['loss']:.4f}"),
            ("masked_accuracy", f"{result['masked_accuracy']:.4f}"),
            ("perplexity", f"{result['perplexity']:.2f}")]
    return "\n".join(f"{name:<16} {value}" for name, value in rows)


def main(argv=None) -> int:
    args = _parser().parse_args(argv)

    def body():
        from kroberta.training.evaluation import evaluate

        data = args.data[0] if len(args.data) == 1 else args.data
        result = evaluate(load_model(args.model), data, batch_size=args.batch_size)
        print(json.dumps({"model": args.model, "data": args.data, **result}) if args.json
              else _table(args.model, args.data, result))

    return cli.run(body)


if __name__ == "__main__":
    sys.exit(main())

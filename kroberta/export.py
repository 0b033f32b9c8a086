"""Export a finished run as a Hugging Face `RobertaForMaskedLM` directory or a keras-hub preset.

    python -m kroberta.export --run runs/x --out hf_model/ [--overwrite]
    python -m kroberta.export --run runs/x --format keras-hub --out preset/

The first loads with `transformers.RobertaForMaskedLM.from_pretrained("hf_model/")`
and, when the run has a tokenizer, `AutoTokenizer.from_pretrained("hf_model/")`; the
second with `keras_hub.models.RobertaMaskedLM.from_preset("preset/")` (and
`RobertaBackbone` / `RobertaTokenizer.from_preset`).
Errors are one line on stderr and exit status 2.
"""

import argparse
import os
import sys

from kroberta import cli as cli_lib
from kroberta.errors import KrobertaError


FORMATS = ("hf", "keras-hub")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m kroberta.export", description=__doc__.split("\n")[1])
    parser.add_argument("--run", required=True, help="a finished run directory (config.toml + model.weights.h5)")
    parser.add_argument("--out", required=True, help="directory to write the model into")
    parser.add_argument("--format", choices=FORMATS, default="hf",
                        help="hf: Hugging Face transformers (default); keras-hub: a keras-hub preset")
    parser.add_argument("--overwrite", action="store_true",
                        help="write into a non-empty --out (replacing the files an export writes)")
    return parser


class ExportError(KrobertaError):
    """A user-facing problem: printed as one line, exit status 2."""


def main(run: str, out: str, overwrite: bool = False, format: str = "hf") -> str:
    """Exports the run at `run` (with its tokenizer, if any) into `out` in `format`
    ("hf" or "keras-hub"); returns `out`."""
    from kroberta.training import saving as checkpoint_io
    from kroberta.interop import hf, keras_hub as keras_hub_preset

    if format not in FORMATS:
        raise ExportError(f"--format {format!r}: expected one of {', '.join(FORMATS)}")

    if not os.path.isdir(run):
        raise ExportError(f"{run}: not a kroberta run directory (no such directory)")
    if os.path.exists(out) and not os.path.isdir(out):
        raise ExportError(f"--out {out}: exists and is not a directory")
    non_empty = os.path.isdir(out) and bool(os.listdir(out))
    if non_empty and not overwrite:
        raise ExportError(f"--out {out}: directory is not empty (pass --overwrite to replace its export)")
    try:
        model = checkpoint_io.load(run, mixed_precision=False)  # float32 weights either way
    except (FileNotFoundError, ValueError) as e:  # ConfigError is a ValueError
        raise ExportError(str(e)) from None
    if non_empty:
        # Drop the files a previous export wrote, so e.g. a stale tokenizer cannot survive.
        for name in (hf.EXPORT_FILES if format == "hf" else keras_hub_preset.EXPORT_FILES):
            path = os.path.join(out, name)
            if os.path.isfile(path):
                os.remove(path)
    if format == "hf":
        hf.export_hf(model, out, tokenizer=model.tokenizer)
    else:
        try:
            keras_hub_preset.export_keras_hub(model, out, tokenizer=model.tokenizer)
        except keras_hub_preset.KerasHubPresetError as e:
            raise ExportError(str(e)) from None
    return out


def cli(argv=None) -> int:
    args = _parser().parse_args(argv)

    def body():
        out = main(args.run, args.out, args.overwrite, args.format)
        print(f"exported {args.run} -> {out}")

    return cli_lib.run(body)


if __name__ == "__main__":
    sys.exit(cli())

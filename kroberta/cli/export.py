"""Export a run as a Hugging Face `RobertaForMaskedLM` directory or a keras-hub preset.

    python -m kroberta.export --run runs/x --out hf_model/ [--overwrite]
    python -m kroberta.export --run runs/x --format keras-hub --out preset/

The first loads with `transformers.RobertaForMaskedLM.from_pretrained("hf_model/")`
and, when the run has a tokenizer, `AutoTokenizer.from_pretrained("hf_model/")`; the
second with `keras_hub.models.RobertaMaskedLM.from_preset("preset/")` (and
`RobertaBackbone` / `RobertaTokenizer.from_preset`). A fine-tuned classifier's folder
(`python -m kroberta.finetune --out`) as --run becomes a `RobertaForSequenceClassification`
directory or a `RobertaTextClassifier` preset (`kroberta.load` reads either back).
Errors are one line on stderr and exit status 2.
"""

from kroberta import cli, storage
from kroberta.errors import InputError
from kroberta.interop import EXPORT_FORMATS, check_out_dir
from kroberta.run_layout import RUN, model_source


def _parser():
    parser = cli.ArgumentParser(
        prog="python -m kroberta.export", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--run",
        required=True,
        help="a run directory (its final model; an unfinished run's latest "
        "checkpoint, with a notice), or a fine-tuned classifier's folder "
        "(python -m kroberta.finetune --out)",
    )
    parser.add_argument("--out", required=True, help="directory to write the model into")
    parser.add_argument(
        "--format",
        choices=EXPORT_FORMATS,
        default="hf",
        help="hf: Hugging Face transformers (default); keras-hub: a keras-hub preset",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="write into a non-empty --out (replacing the files an export writes)",
    )
    return parser


def main(argv=None) -> int:
    args = _parser().parse_args(argv)

    def body():
        # Before the model is loaded (and JAX, Keras and TensorFlow imported): the mistake
        # is named at once.
        check_out_dir(args.out, args.overwrite, "--out", args.format)
        storage.check_writable(args.out, "--out")  # staged beside it, then renamed
        if model_source(args.run, "--run")[0] != RUN:
            raise InputError(
                f"--run: {args.run} is already a Hugging Face directory or keras-hub "
                "preset; give a kroberta run (or load it with kroberta.load and call "
                "kroberta.export_hf / export_keras_hub)"
            )
        from kroberta.downstream.model_files import export_run  # start-up time: after the checks

        out = export_run(args.run, args.out, args.overwrite, args.format)
        print(f"exported {args.run} -> {out}")

    return cli.run(body)

"""`python -m kroberta.export`'s work: a run's masked LM, or a fine-tuned classifier's
folder, written as a Hugging Face directory or a keras-hub preset.

It sits with the classifiers because it reads both heads: a run directory through
`training.final_model.load`, a classifier's folder through `prediction.load_classifier`.
"""

from kroberta import storage
from kroberta.errors import InputError
from kroberta.interop import EXPORT_FORMATS, check_out_dir
from kroberta.run_layout import CLASSIFIER_FILE
from kroberta.training.final_model import check_run_dir, load


def export_run(run: str, out: str, overwrite: bool = False, format: str = "hf") -> str:
    """Exports the run at `run` (with its tokenizer, if any) into `out` in `format`
    ("hf" or "keras-hub"); returns `out`. A fine-tuned classifier's folder
    (`kroberta.finetune`'s `--out`) becomes a `RobertaForSequenceClassification`
    directory or a `RobertaTextClassifier` preset."""
    if format not in EXPORT_FORMATS:
        raise InputError(f"--format {format!r}: expected one of {', '.join(EXPORT_FORMATS)}")
    # Before the model is loaded (and JAX, Keras and TensorFlow imported): the mistake is
    # named at once.
    check_out_dir(out, overwrite, "--out", format)
    classifier = storage.isfile(storage.join(run, CLASSIFIER_FILE))
    if not classifier:
        check_run_dir(run)
    # Keras and TensorFlow load with these: after the checks.
    from kroberta.downstream.prediction import load_classifier
    from kroberta.interop import hf, keras_hub_presets

    try:
        if classifier:
            model = load_classifier(run)
        else:
            model = load(run, mixed_precision=False)  # float32 weights either way
    except (FileNotFoundError, ValueError) as e:  # no such run; ConfigError is a ValueError
        raise InputError(str(e)) from None
    if format == "hf":
        hf.export_hf(model, out, tokenizer=model.tokenizer, overwrite=overwrite)
    else:
        keras_hub_presets.export_keras_hub(model, out, tokenizer=model.tokenizer,
                                           overwrite=overwrite)
    return out

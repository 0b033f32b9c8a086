"""`python -m kroberta.export`'s work: the masked LM or the fine-tuned classifier a
kroberta directory holds (`kroberta.load`), written as a Hugging Face directory or a
keras-hub preset."""

from kroberta import storage
from kroberta.errors import InputError
from kroberta.interop import EXPORT_FORMATS, check_out_dir
from kroberta.run_layout import RUN, model_source


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
    storage.check_writable(out, "--out")  # staged beside it, then renamed
    if model_source(run, "--run")[0] != RUN:
        raise InputError(f"--run: {run} is already a Hugging Face directory or keras-hub "
                         "preset; give a kroberta run (or load it with kroberta.load and call "
                         "kroberta.export_hf / export_keras_hub)")
    # Start-up time: Keras and TensorFlow load with these, after the checks.
    from kroberta.downstream.loading import load  # start-up time (above)
    from kroberta.interop import hf, keras_hub_presets  # start-up time (above)

    model = load(run, mixed_precision=False)  # float32 weights either way
    # Staged beside `out` and renamed when whole (`interop.staged_export`): a full disk
    # leaves `out` as it was.
    with storage.writing(out, f"{format} export", "nothing was written there (an earlier "
                         "export is kept); free some space and run the same command again"):
        if format == "hf":
            hf.export_hf(model, out, tokenizer=model.tokenizer, overwrite=overwrite)
        else:
            keras_hub_presets.export_keras_hub(model, out, tokenizer=model.tokenizer,
                                               overwrite=overwrite)
    return out

"""One base for every error kroberta raises on purpose.

Each error keeps the standard base that describes it too (`ConfigError` is a
`ValueError`, `CheckpointWriteError` an `OSError`), so code that catches those
still does; `except KrobertaError` catches all of kroberta's own.
"""

import os


class KrobertaError(Exception):
    """A problem kroberta found and can say in one line: bad input, bad config, a failed run."""


class DivergedError(KrobertaError, FloatingPointError):
    """The training loss became NaN or inf."""


class ArgumentKindError(KrobertaError, TypeError):
    """An argument of another kind than the function takes: a path where a model goes, a
    model where a path goes."""


def check_model(model, where: str):
    """Raises ArgumentKindError unless `model` is a `kroberta.MaskedLM` (as `kroberta.load`,
    `from_hf` and `from_keras_hub` return); a path given instead gets the call to load it,
    a keras-hub model the call that makes it kroberta's."""
    import keras

    from kroberta.model.masked_lm import MaskedLM

    if isinstance(model, MaskedLM):
        return
    if isinstance(model, (str, os.PathLike)):
        hint = f"; load it first: model = kroberta.load({os.fspath(model)!r})"
    elif isinstance(model, keras.Model):
        hint = ("; a keras-hub model becomes kroberta's with kroberta.from_keras_hub(PRESET_DIR) "
                "(save it with model.save_to_preset(PRESET_DIR) first)")
    else:
        hint = ""
    raise ArgumentKindError(f"{where}: expected a model (kroberta.load(run_dir), "
                            f"kroberta.from_hf(dir), ...), got {type(model).__name__}{hint}")

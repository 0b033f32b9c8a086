"""The errors kroberta raises on purpose: one base and the few kinds a caller would catch apart.

Each keeps the standard base that describes it too (`ConfigError` is a `ValueError`,
`NotFoundError` a `FileNotFoundError`, `StorageError` an `OSError`), so code that catches those
still does; `except KrobertaError` catches all of kroberta's own. The message says what is wrong,
where (file, record, key) and what to do; the class says only which kind of thing to fix.
"""


class KrobertaError(Exception):
    """A problem kroberta found and can say in one line: bad input, bad config, a failed run."""


class ConfigError(KrobertaError, ValueError):
    """A config file, a config key or a command-line option is wrong."""


class InputError(KrobertaError, ValueError):
    """The data, a model or a value given to a command or function cannot be used as it is: text
    or labelled files, prepared records, a tokenizer, prediction inputs, a run to evaluate or
    export."""


class NotFoundError(KrobertaError, FileNotFoundError):
    """A file, run directory or checkpoint that was named does not exist."""


class ConversionError(KrobertaError, ValueError):
    """A Hugging Face or keras-hub model cannot be converted to or from kroberta's."""


class StorageError(KrobertaError, OSError):
    """Reading or writing a file failed (local disk or object storage): permissions, a full
    disk, a checkpoint that could not be written."""


class WorkerError(KrobertaError, RuntimeError):
    """A worker process died (a signal, the out-of-memory killer): the message names what it
    was working on and how the work goes on."""


class DivergedError(KrobertaError, FloatingPointError):
    """The training loss became NaN or inf."""


class ArgumentKindError(KrobertaError, TypeError):
    """An argument of another kind than the function takes: a path where a model goes, a
    model where a path goes."""


class BackendError(KrobertaError, RuntimeError):
    """Keras runs on another backend than JAX, or JAX cannot start its devices."""


class TrackerError(KrobertaError, RuntimeError):
    """An experiment tracker (TensorBoard, Weights & Biases, MLflow) could not be started."""

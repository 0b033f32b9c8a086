"""One base for every error kroberta raises on purpose.

Each error keeps the standard base that describes it too (`ConfigError` is a
`ValueError`, `CheckpointWriteError` an `OSError`), so code that catches those
still does; `except KrobertaError` catches all of kroberta's own.
"""


class KrobertaError(Exception):
    """A problem kroberta found and can say in one line: bad input, bad config, a failed run."""


class DivergedError(KrobertaError, FloatingPointError):
    """The training loss became NaN or inf."""


class ArgumentKindError(KrobertaError, TypeError):
    """An argument of another kind than the function takes: a path where a model goes, a
    model where a path goes."""

"""kroberta's messages: the `kroberta` logger and the one handler that shows them.

Library modules log through `logging.getLogger(__name__)`, children of the `kroberta`
logger; they never print. The commands (`python -m kroberta.X`) call `configure()`:
one handler on stderr, each message one line as it was written. The Python API's entry
points (`kroberta.train`, `kroberta.dataset`) call `show_messages()`, which shows them
on stdout where the application configured no logging of its own, and otherwise leaves
them to the application's handlers.

In a multi-process job only process 0 says what it does (INFO); the others say
warnings and errors only (`MainProcessOnly`).
"""

import contextlib
import logging
import sys

PACKAGE = "kroberta"
FORMAT = "%(message)s"  # the line as written: no level, no logger name, no time


class MainProcessOnly(logging.Filter):
    """Passes a record below WARNING only on process 0 of a multi-process job."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or _process_index() == 0


def _process_index() -> int:
    # Asks JAX only once it has joined a job: before that (or without JAX imported) this
    # is process 0, and asking would start a backend before `jax.distributed.initialize`.
    jax = sys.modules.get("jax")
    if jax is None or not jax.distributed.is_initialized():
        return 0
    return jax.process_index()


class _StandardStream(logging.StreamHandler):
    """A handler on sys.stdout or sys.stderr as they are at each message (a notebook's,
    a redirection's), not as they were when it was made."""

    def __init__(self, name: str):
        self._stream_name = name
        super().__init__()

    @property
    def stream(self):
        return getattr(sys, self._stream_name)

    @stream.setter
    def stream(self, value):  # StreamHandler.__init__ sets it: the name decides instead
        pass

    def handleError(self, record):
        # `python -m kroberta.report RUN | head -1`: the reader is gone, so the other lines
        # have nowhere to go; logging's traceback for each of them would say nothing.
        if not isinstance(sys.exc_info()[1], BrokenPipeError):
            super().handleError(record)


def _install(stream_name: str):
    logger = logging.getLogger(PACKAGE)
    for old in [h for h in logger.handlers if getattr(h, "kroberta", False)]:
        logger.removeHandler(old)
    handler = _StandardStream(stream_name)
    handler.setFormatter(logging.Formatter(FORMAT))
    handler.addFilter(MainProcessOnly())
    handler.kroberta = True  # ours: replaced, never doubled, by a second call
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # one line per message, whatever the root logger has


@contextlib.contextmanager
def configured(stream_name: str = "stderr"):
    """A command's logging while it runs: kroberta's messages, one line each, on stderr
    (stdout for a command whose messages are its output); the `kroberta` logger as it was
    afterwards (a command called from Python, a test)."""
    logger = logging.getLogger(PACKAGE)
    before = (list(logger.handlers), logger.level, logger.propagate)
    _install(stream_name)
    try:
        yield
    finally:
        logger.handlers[:] = before[0]
        logger.setLevel(before[1])
        logger.propagate = before[2]


def show_messages():
    """At a Python API entry point: kroberta's INFO messages reach the user.

    Where nothing handles them (no handler on the `kroberta` logger or above it), one
    on stdout, as a notebook or script shows printed lines; otherwise the application's
    (or a test's) handlers receive them at INFO.
    """
    logger = logging.getLogger(PACKAGE)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    if not logger.hasHandlers():
        _install("stdout")

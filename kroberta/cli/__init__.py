"""How the `python -m kroberta.X` commands end: one line on stderr and an exit code.

    0    done
    2    bad input or config (any KrobertaError, and the errors a command adds)
    3    the training loss diverged
    130  interrupted (Ctrl-C, SIGINT)
    143  preempted or stopped (SIGTERM): by train after its checkpoint, by the others at once

Every command takes SIGINT and SIGTERM itself (`stop_signals`), whatever it inherited: a
command a script starts in the background inherits SIGINT ignored, and would otherwise
run on through every Ctrl-C or `kill -INT`.
"""

import argparse
import contextlib
import difflib
import importlib
import os
import signal
import sys
import threading

from kroberta.errors import KrobertaError
from kroberta.runtime import logs, quiet_start

BAD_INPUT = 2
DIVERGED = 3
INTERRUPTED = 130
PREEMPTED = 143  # 128 + SIGTERM, as if the signal had ended the process


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised as an interrupt is, so that whatever a Ctrl-C cleans up (a partly
    written file, a run directory with no checkpoint) a SIGTERM cleans up too."""


# How long a stop that could not be raised waits before it is sent again: long enough
# for the code that held it back (an import, a garbage-collector callback) to go on.
REDELIVERY_SECONDS = 0.05


def _send_again(signum):
    """Sends `signum` to this process a moment later, from a thread: raised now, the stop
    would be lost or do harm."""
    timer = threading.Timer(REDELIVERY_SECONDS, os.kill, (os.getpid(), signum))
    timer.daemon = True
    timer.start()


def _importing(frame) -> bool:
    """Whether `frame` (or a caller of it) runs an import."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _stopper(in_import):
    """The handler of SIGINT (KeyboardInterrupt) and SIGTERM (`Terminated`). A stop that
    lands in an import must not be raised there: a KeyboardInterrupt in NumPy's import
    leaves it half made, and JAX's extension, importing it next, dies of a segmentation
    fault (exit -11, no message). There `in_import(signum)` is called instead (None: the
    stop waits until the import is done)."""

    def stop(signum, frame):
        if _importing(frame):
            (in_import or _send_again)(signum)
            return
        raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt

    # Python's default, as far as training is concerned: it installs its own Ctrl-C
    # handler (a checkpoint first) in place of either (`kroberta.training.preemption`).
    stop.interrupts_by_default = True
    return stop


def _redeliver_stops(previous_hook):
    """A `sys.unraisablehook` for a stop (KeyboardInterrupt, `Terminated`) that Python
    could not raise: a signal handler's exception raised inside a garbage-collector
    callback or a finalizer (JAX registers one, `_xla_gc_callback`) is printed as
    "Exception ignored in ..." with a traceback and the command runs on. The signal is
    sent again, to land in the command's own code; other unraisable errors go to
    `previous_hook`."""

    def hook(unraisable):
        kind = unraisable.exc_type
        if isinstance(kind, type) and issubclass(kind, KeyboardInterrupt):
            _send_again(signal.SIGTERM if issubclass(kind, Terminated) else signal.SIGINT)
        else:
            previous_hook(unraisable)

    return hook


@contextlib.contextmanager
def stop_signals(in_import=None):
    """SIGINT raises KeyboardInterrupt and SIGTERM raises `Terminated` inside the block,
    also where the process inherited them ignored (`cmd &` in a script ignores SIGINT) or
    at their default (SIGTERM would end the process with no cleanup). A handler the
    caller installed in Python stays; training replaces these with its own while it fits
    (`kroberta.training.preemption`: a checkpoint first). The previous handlers come back
    after the block. Outside the main thread, where no handler can be set, nothing changes.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    # None: set outside Python; Python's own Ctrl-C handler, which raises inside imports.
    inherited = (signal.SIG_IGN, signal.SIG_DFL, None, signal.default_int_handler)
    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(signum) in inherited:
            previous[signum] = signal.signal(signum, _stopper(in_import))
    unraisable_hook = sys.unraisablehook
    sys.unraisablehook = _redeliver_stops(unraisable_hook)
    try:
        yield
    finally:
        sys.unraisablehook = unraisable_hook
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


class _DefaultsHelpFormatter(argparse.HelpFormatter):
    """argparse's help with each option's default appended, `(default: 3)`, unless its help
    already says what the default is, or there is none to show (None, a flag that is off)."""

    def _get_help_string(self, action):
        text = action.help
        default = action.default
        if (
            not action.option_strings
            or default is None
            or default is False
            or default is argparse.SUPPRESS
            or "default" in text
        ):
            return text
        return f"{text} (default: %(default)s)"


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser whose errors are one line (no usage block) with exit code 2, which
    names a misspelt flag's likely meaning and the likely cause of extra path arguments: the
    input option left out, or a pattern the shell expanded."""

    def __init__(self, *args, inputs: str | None = None, **kwargs):
        """`inputs`: the option that takes the command's input paths (`--input`), named
        when paths are given without it."""
        self._flags = []  # before argparse adds --help through add_argument
        # `--vocab 500` must not quietly mean `--vocab-size 500`: a flag is spelled whole.
        kwargs.setdefault("formatter_class", _DefaultsHelpFormatter)
        super().__init__(*args, allow_abbrev=False, **kwargs)
        self._inputs = inputs
        self._words = []

    def add_argument(self, *names, **kwargs):
        self._flags.extend(name for name in names if name.startswith("-"))  # for `error`
        return super().add_argument(*names, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        self._words = list(sys.argv[1:] if args is None else args)  # for `error`
        return super().parse_known_args(args, namespace)

    def error(self, message: str):
        # A misspelt flag, named with the one meant; `--modle x` makes argparse name the
        # missing `--model` first. (Dotted words are train's config keys, checked there.)
        for word in dict.fromkeys(word.split("=")[0] for word in self._words):
            if word.startswith("--") and "." not in word and word not in self._flags:
                close = difflib.get_close_matches(word, self._flags, n=1)
                if close:
                    message += f"; {word}: did you mean {close[0]}?"
                elif not message.startswith("unrecognized arguments:"):
                    message += f"; {word}: unrecognized"
        extra = message.removeprefix("unrecognized arguments:").split(";")[0].split()
        # An unknown option (`--inptu x.csv`) explains its own words; paths alone suggest a
        # left-out option or a pattern.
        if (
            message.startswith("unrecognized arguments:")
            and any(map(os.path.exists, extra))
            and not any(word.startswith("-") for word in extra)
        ):
            if self._inputs and not any(word.split("=")[0] == self._inputs for word in self._words):
                message += f"; input paths follow {self._inputs}: {self._inputs} {extra[0]}"
            else:
                folder = os.path.dirname(extra[0]) or "."
                ending = os.path.splitext(extra[0])[1]
                message += (
                    f"; if the shell expanded an unquoted pattern into these, quote it: "
                    f"'{folder}/*{ending}'"
                )
        print(f"{self.prog}: error: {message} (see --help)", file=sys.stderr)
        sys.exit(BAD_INPUT)


def run(
    body,
    *,
    interrupted: str = "interrupted",
    also: tuple[type[BaseException], ...] = (),
    messages: str = "stderr",
    when_out_of_memory: str | None = None,
) -> int:
    """Runs `body()` (which returns an exit code, None meaning 0) and maps its errors.

    Args:
        body: the command's work, a function of no arguments.
        interrupted: the line printed on KeyboardInterrupt (SIGINT); on SIGTERM its first
            word becomes "stopped by SIGTERM".
        also: other exception types that mean bad input to this command.
        messages: where the library's messages go: "stderr", or "stdout" for a command
            whose messages are its output (the report's summary).
        when_out_of_memory: what to lower when XLA runs out of device memory
            ("--batch-size"), or None to leave its error as it is.
    """

    stopped = "stopped by SIGTERM" + interrupted.removeprefix("interrupted")

    def at_once(signum):
        """A stop inside an import (JAX, Keras and TensorFlow load for seconds): the command
        ends now, as a kill would end it (what it wrote is whole or under a temporary name),
        with its line and code. Written to the descriptor: the handler may run while the
        main thread holds sys.stderr's lock, or while TensorFlow's start filters it."""
        terminated = signum == signal.SIGTERM
        line = stopped if terminated else interrupted
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        os.write(quiet_start.stderr_descriptor(), (line + "\n").encode())
        os._exit(PREEMPTED if terminated else INTERRUPTED)

    try:
        with stop_signals(at_once), logs.configured(messages):  # messages: one line each
            return body() or 0
    except FloatingPointError as error:  # a DivergedError, or one raised by JAX's debug_nans
        print(f"error: {error}", file=sys.stderr)
        return DIVERGED
    except (KrobertaError, *also) as error:
        print(f"error: {error}", file=sys.stderr)
        return BAD_INPUT
    except Terminated:
        print(stopped, file=sys.stderr)
        return PREEMPTED
    except KeyboardInterrupt:
        print(interrupted, file=sys.stderr)
        return INTERRUPTED
    except Exception as error:  # after the kinds above: a re-raise here skips them
        exhausted = _out_of_memory(error) if when_out_of_memory else None
        if exhausted is None:
            raise
        print(f"error: {exhausted}; lower {when_out_of_memory}", file=sys.stderr)
        return BAD_INPUT


def _out_of_memory(error: Exception) -> str | None:
    """What ran out of memory, in words, when `error` is XLA's out-of-memory error; else
    None. (tf.data's, building too large a batch on the host, is an InputError already:
    `kroberta.data.bad_records.explain_pipeline_error`.)"""
    if "jax" not in sys.modules:
        return None
    # start-up: read only after a failure, and it loads JAX and the model
    from kroberta.perf import aot_programs

    if not aot_programs.out_of_memory(error)[0]:
        return None
    # XLA's first line says how much it wanted; the rest is its traceback.
    return f"the device ran out of memory ({str(error).splitlines()[0]})"


def run_command(module_name: str, command: str):
    """What `kroberta/<command>.py` does: under `python -m kroberta.<command>`, runs
    `kroberta.cli.<command>.main()` and exits with its code; imported as a module, it
    raises ImportError, since the module would take the place of the Python API's
    function of the same name on the package (`kroberta.predict`, `kroberta.train`, ...).
    """
    if module_name != "__main__":
        raise ImportError(
            f"kroberta.{command} is run as `python -m kroberta.{command}`; the "
            f"command's module is kroberta.cli.{command}, the Python API "
            "is the package's functions (kroberta.train, kroberta.predict, ...)"
        )
    sys.exit(importlib.import_module(f"kroberta.cli.{command}").main())

"""Progress that fits where it runs: one display for prepare, train, finetune and predict.

In a terminal: one line redrawn in place. In a Jupyter notebook: one display (an
HTML progress bar with a text fallback) updated in place, never a line per update.
Anywhere else (a log file, a pipe): rows, a few seconds apart (`Progress`: prepare's
bytes, a fine-tune's steps, predict's examples), or train's rows of metrics, one per
log interval, which it prints itself.

Why our own and not Keras' `Progbar`, `tqdm` or `rich`, all installed through the
dependencies: `Progbar` writes terminal escape codes into a file or a pipe (or,
with `verbose=2`, one line at the end) and knows steps, not bytes per second;
`tqdm` writes its carriage-return redraws into a log file (one line that never
ends) and needs `ipywidgets`, which is not installed, for its notebook bar; `rich`
draws from a thread of its own, beside prepare's worker pool and Keras' `fit`. Each
would need this module's choices around it (when to draw, rows for logs, lines
above the bar) and none removes code, so the one display is this module, which
prepare's byte counts use too.
"""

import html
import sys
import time

_SHOWN = ("loss", "masked_accuracy", "grad_norm", "samples_per_second")  # those present
LIVE_EVERY_S = 0.25  # a live display redrawn at most this often
LOG_EVERY_S = 10.0  # on a file or a pipe: a row this often, not one redrawn line


def in_jupyter() -> bool:
    """True inside a Jupyter kernel (Jupyter, JupyterLab, Colab, VS Code notebooks)."""
    ipython = sys.modules.get("IPython")
    if ipython is None or "ipykernel" not in sys.modules:
        return False
    shell = ipython.get_ipython()
    # A kernel's shell owns `kernel`; terminal IPython has none (its stdout is a tty).
    return shell is not None and getattr(shell, "kernel", None) is not None


def live_progress(total_steps: int, start_step: int = 0, stream=None, label: str | None = None):
    """A live bar for a run of `total_steps` (or of bytes, with a `label`: `Progress`),
    or None where plain rows fit better (a file, a pipe)."""
    if in_jupyter():
        return NotebookBar(total_steps, start_step, label=label)
    stream = stream or sys.stdout
    if getattr(stream, "isatty", lambda: False)():
        return TerminalBar(total_steps, start_step, stream, label=label)
    return None


class _Bar:
    """What a display shows: steps (`step`/`total`, the metrics in `values`), with a
    `label` bytes (MB done, MB/s), or with a `unit` too a count of that unit (done,
    per second, seconds; `total` None: not known); each line after its `title` when
    one is set."""

    title = None  # what is counted ("sst2 lr 0.001 seed 0"): `Progress(title=...)`
    unit = None  # what a count counts ("examples"): `Progress(unit=...)`

    def __init__(self, total_steps, start_step=0, label=None):
        self.total = None if total_steps is None else max(int(total_steps), 1)
        self.start_step = start_step
        self.step = start_step
        self.values = {}
        self.label = label
        self._started = time.perf_counter()

    def text(self, width=30) -> str:
        fraction = min(self.step / (self.total or 1), 1.0)
        filled = int(fraction * width)
        bar = "=" * filled + (">" if filled < width else "") + "." * (width - filled - 1)
        elapsed = max(time.perf_counter() - self._started, 1e-9)
        done = self.step - self.start_step
        if self.unit is not None:
            rate = done / elapsed
            count = (
                f"{self.step}/{self.total} {self.unit} [{bar[:width]}]"
                if self.total
                else f"{self.step} {self.unit}"
            )
            parts = [
                f"{self.label}: {count}",  # a slow start is not "0/s"
                (f"{rate:,.1f}" if rate < 10 else f"{rate:,.0f}") + "/s",
                f"{elapsed:.1f}s",
            ]
        elif self.label is None:
            parts = [f"step {self.step}/{self.total} [{bar[:width]}] {100 * fraction:3.0f}%"]
            parts += [f"{key} {self.values[key]:.4g}" for key in _SHOWN if key in self.values]
        else:
            parts = [
                f"{self.label}: [{bar[:width]}] {self.step / 1e6:.1f}/{self.total / 1e6:.1f} MB",
                f"{done / 1e6 / elapsed:.2f} MB/s",
            ]
        if self.total and 0 < done and self.step < self.total:
            left = elapsed / done * (self.total - self.step)
            parts.append(f"eta {int(left) // 60}:{int(left) % 60:02d}")
        return (f"{self.title}: " if self.title else "") + "  ".join(parts)

    def update(self, step: int, values: dict):
        """Shows `step` and the interval's metrics (keys of `_SHOWN` that are present)."""
        self.step = step
        self.values = dict(values)
        self._draw()

    def close(self):
        """Ends the display (a notebook's output and a file's rows need no ending)."""

    def erase(self):
        """Blanks the bar where it can be blanked (a terminal's line)."""


class TerminalBar(_Bar):
    """One line, redrawn with a carriage return."""

    def __init__(self, total_steps, start_step, stream, label=None):
        super().__init__(total_steps, start_step, label)
        self.stream = stream
        self._width = 0  # characters on the line now, to blank a shorter redraw

    def _write_line(self, text, end=""):
        self.stream.write("\r" + text.ljust(self._width) + end)
        self.stream.flush()
        self._width = 0 if end else len(text)

    def _draw(self):
        self._write_line(self.text())

    def note(self, line: str):
        """A line of its own (an evaluation) above the bar, which is then redrawn."""
        self._write_line(line, end="\n")
        self._draw()

    def close(self):
        if self._width:
            self.stream.write("\n")
            self.stream.flush()
            self._width = 0

    def erase(self):
        """Blanks the bar's line (a bar that made way for a summary line)."""
        if self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0


class NotebookBar(_Bar):
    """One notebook output, replaced in place at every update."""

    def __init__(self, total_steps, start_step, label=None):
        super().__init__(total_steps, start_step, label)
        from IPython.display import display  # IPython: present only in a notebook

        self._handle = display(self._bundle(), raw=True, display_id=True)

    def _bundle(self) -> dict:
        text = self.text()
        return {
            "text/plain": text,
            "text/html": f"<progress value='{self.step}' max='{self.total or 1}' "
            f"style='width:30em'></progress> <code>{html.escape(text)}</code>",
        }

    def _draw(self):
        self._handle.update(self._bundle(), raw=True)

    def note(self, line: str):
        print(line, flush=True)  # below the bar, which keeps its place


class _Rows(_Bar):
    """A file or a pipe: each draw a row of its own, handed to `write`."""

    def __init__(self, total_steps, start_step, label, write):
        super().__init__(total_steps, start_step, label)
        self.write = write

    def _draw(self):
        self.write(self.text())

    def note(self, line: str):
        self.write(line)


class Progress:
    """A count shown where it runs (prepare's bytes, a fine-tune's steps, predict's
    examples): a live bar
    redrawn at most every `LIVE_EVERY_S`, or rows every `LOG_EVERY_S` in a file or a
    pipe; nothing when not `enabled`.

    Args:
        total: the count at the end (steps, or bytes with a `label`); None with a `unit`:
            not known.
        label: what is counted in bytes ("tokenizer", "encode+pack+write"), or with a
            `unit` what counts it ("predict"); None: steps.
        unit: what a count of `label`'s counts ("examples"); None: bytes or steps.
        start: the count at the start (a resumed run's step).
        enabled: False: shows nothing.
        stream: where to draw (default: stderr).
        rows: where a row goes instead of a live bar (default: a line on `stream`).
        title: shown before the count on every line (a fine-tune's trial); notes are
            shown as they are given.
    """

    def __init__(
        self,
        total: int,
        label: str | None = None,
        start: int = 0,
        enabled: bool = True,
        stream=None,
        rows=None,
        title: str | None = None,
        unit: str | None = None,
    ):
        stream = stream or sys.stderr
        self.display = live_progress(total, start, stream, label) if enabled else None
        self.every = LIVE_EVERY_S
        if enabled and self.display is None:
            write = rows or (lambda text: (stream.write(text + "\n"), stream.flush()))
            self.display, self.every = _Rows(total, start, label, write), LOG_EVERY_S
        if self.display is not None:
            self.display.title, self.display.unit = title, unit
        self.done, self.values = start, {}
        self.start = self._last_draw = time.perf_counter()

    def update(self, done: int, values: dict | None = None):
        """The count is `done`, with the metrics `values`; draws when the last draw is
        old enough."""
        self.done, self.values = done, values or {}
        now = time.perf_counter()
        if self.display is not None and now - self._last_draw >= self.every:
            self._last_draw = now
            self.display.update(self.done, self.values)

    def add(self, count: int):
        """Counts `count` more (an `on_bytes` callback)."""
        self.update(self.done + count)

    def note(self, line: str):
        """A line of its own: above a live bar, or a row."""
        if self.display is not None:
            self.display.note(line)

    def close(self) -> float:
        """Draws the final count and ends the line; returns the seconds since the start."""
        if self.display is not None:
            self.display.update(self.done, self.values)
            self.display.close()
        return time.perf_counter() - self.start

    def erase(self):
        """Takes a live bar off the screen (a summary line takes its place)."""
        if self.display is not None:
            self.display.erase()

"""Training progress that fits where it runs.

In a terminal: one line redrawn in place. In a Jupyter notebook: one display
(an HTML progress bar with a text fallback) updated in place, never a line per
update. Anywhere else (a log file, a pipe) there is no bar: the caller prints
plain lines, one per log interval.
"""

import html
import sys
import time

_SHOWN = ("loss", "masked_accuracy", "grad_norm", "samples_per_second")  # those present


def in_jupyter() -> bool:
    """True inside a Jupyter kernel (Jupyter, JupyterLab, Colab, VS Code notebooks)."""
    ipython = sys.modules.get("IPython")
    if ipython is None or "ipykernel" not in sys.modules:
        return False
    shell = ipython.get_ipython()
    # A kernel's shell owns `kernel`; terminal IPython has none (its stdout is a tty).
    return shell is not None and getattr(shell, "kernel", None) is not None


def live_progress(total_steps: int, start_step: int = 0, stream=None):
    """A live bar for a run of `total_steps`, or None where plain lines fit better."""
    if in_jupyter():
        return NotebookBar(total_steps, start_step)
    stream = stream or sys.stdout
    if getattr(stream, "isatty", lambda: False)():
        return TerminalBar(total_steps, start_step, stream)
    return None


class _Bar:
    def __init__(self, total_steps, start_step):
        self.total = max(int(total_steps), 1)
        self.start_step = start_step
        self.step = start_step
        self.values = {}
        self._started = time.perf_counter()

    def text(self, width=30) -> str:
        fraction = min(self.step / self.total, 1.0)
        filled = int(fraction * width)
        bar = "=" * filled + (">" if filled < width else "") + "." * (width - filled - 1)
        parts = [f"step {self.step}/{self.total} [{bar[:width]}] {100 * fraction:3.0f}%"]
        parts += [f"{key} {self.values[key]:.4g}" for key in _SHOWN if key in self.values]
        done = self.step - self.start_step
        if 0 < done and self.step < self.total:
            left = (time.perf_counter() - self._started) / done * (self.total - self.step)
            parts.append(f"eta {int(left) // 60}:{int(left) % 60:02d}")
        return "  ".join(parts)

    def update(self, step: int, values: dict):
        """Shows `step` and the interval's metrics (keys of `_SHOWN` that are present)."""
        self.step = step
        self.values = dict(values)
        self._draw()


class TerminalBar(_Bar):
    """One line, redrawn with a carriage return."""

    def __init__(self, total_steps, start_step, stream):
        super().__init__(total_steps, start_step)
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

    def __init__(self, total_steps, start_step):
        super().__init__(total_steps, start_step)
        # IPython: there in a notebook only
        from IPython.display import display

        self._handle = display(self._bundle(), raw=True, display_id=True)

    def _bundle(self) -> dict:
        text = self.text()
        return {"text/plain": text,
                "text/html": f"<progress value='{self.step}' max='{self.total}' "
                             f"style='width:30em'></progress> <code>{html.escape(text)}</code>"}

    def _draw(self):
        self._handle.update(self._bundle(), raw=True)

    def note(self, line: str):
        print(line, flush=True)  # below the bar, which keeps its place

    def close(self):
        pass

    def erase(self):
        pass

"""A tiny progress bar on stderr: MB done, MB/s, time left (no dependency); a file's reading progress."""

import sys
import time


LOG_EVERY_S = 10.0  # on a file or a pipe: a row this often, not one redrawn line


class Progress:
    """Throttled one-line progress for a byte count; a no-op when disabled. On a
    terminal the line is redrawn in place; in a file or a pipe (a job's log) a row is
    added every `LOG_EVERY_S` seconds and at the end."""

    def __init__(self, description, total_bytes, enabled=True):
        self.description = description
        self.total = max(int(total_bytes), 1)
        self.stream = sys.stderr
        self.enabled = enabled
        self.live = enabled and getattr(self.stream, "isatty", lambda: False)()
        self.done = 0
        self.start = time.perf_counter()
        self._last_draw = self.start

    def update(self, nbytes):
        """Count `nbytes` more and redraw at most 4 times a second."""
        self.done += nbytes
        now = time.perf_counter()
        if self.enabled and now - self._last_draw >= (0.25 if self.live else LOG_EVERY_S):
            self._last_draw = now
            self._draw(now, end="\r" if self.live else "\n")

    def _draw(self, now, end="\r"):
        elapsed = max(now - self.start, 1e-9)
        rate = self.done / elapsed / 1e6
        fraction = min(self.done / self.total, 1.0)
        bar = "#" * int(fraction * 20)
        eta = (self.total - self.done) / 1e6 / rate if rate > 0 and fraction < 1 else 0.0
        self.stream.write(
            f"{self.description}: [{bar:<20}] {self.done / 1e6:8.1f}/{self.total / 1e6:.1f} MB "
            f"{rate:6.2f} MB/s  {elapsed:5.1f}s  {eta:4.0f}s left{end}"
        )
        self.stream.flush()

    def close(self):
        """Draw the final state and end the line; returns elapsed seconds."""
        now = time.perf_counter()
        if self.enabled:
            self._draw(now, end="\n")
        return now - self.start


class ByteProgress:
    """Reports a raw file's position to `on_bytes` (None: no-op) about once per MB, from
    `start` (where its reading begins), and all up to `size` at the end."""

    def __init__(self, raw, on_bytes, start=0):
        self.raw, self.on_bytes, self.reported, self.calls = raw, on_bytes, start, 0

    def poll(self):
        self.calls += 1
        # The position is asked once every 256 records, not per record: progress needs no more.
        if self.on_bytes is not None and self.calls % 256 == 0:
            position = self.raw.tell()
            if position - self.reported >= 1 << 20:
                self.on_bytes(position - self.reported)
                self.reported = position

    def finish(self, size):
        if self.on_bytes is not None and size > self.reported:
            self.on_bytes(size - self.reported)
            self.reported = size

"""A tiny progress bar on stderr: bytes done, MB/s, ETA (no dependency)."""

import sys
import time


class Progress:
    """Throttled one-line progress for a byte count; a no-op when disabled."""

    def __init__(self, description, total_bytes, enabled=True, stream=None):
        self.description = description
        self.total = max(int(total_bytes), 1)
        self.stream = stream or sys.stderr
        self.enabled = enabled
        # Redraw in place only on a terminal; in a log, print just the final line.
        self.live = enabled and getattr(self.stream, "isatty", lambda: False)()
        self.done = 0
        self.start = time.perf_counter()
        self._last_draw = self.start

    def update(self, nbytes):
        """Count `nbytes` more and redraw at most 4 times a second."""
        self.done += nbytes
        now = time.perf_counter()
        if self.live and now - self._last_draw >= 0.25:
            self._last_draw = now
            self._draw(now)

    def _draw(self, now, end="\r"):
        elapsed = max(now - self.start, 1e-9)
        rate = self.done / elapsed / 1e6
        fraction = min(self.done / self.total, 1.0)
        bar = "#" * int(fraction * 20)
        eta = (self.total - self.done) / 1e6 / rate if rate > 0 and fraction < 1 else 0.0
        self.stream.write(
            f"{self.description}: [{bar:<20}] {self.done / 1e6:8.1f}/{self.total / 1e6:.1f} MB "
            f"{rate:6.2f} MB/s  {elapsed:5.1f}s  eta {eta:4.0f}s{end}"
        )
        self.stream.flush()

    def close(self):
        """Draw the final state and end the line; returns elapsed seconds."""
        now = time.perf_counter()
        if self.enabled:
            self._draw(now, end="\n")
        return now - self.start

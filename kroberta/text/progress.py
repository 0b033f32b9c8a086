"""A file's reading progress in bytes, for `on_bytes` callbacks (shown by `kroberta.console.Progress`)."""


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

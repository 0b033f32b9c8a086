"""Where prepare's inputs and prepared directories live: local paths (the standard
library), or URLs (gs://, any fsspec filesystem: `kroberta.storage.filesystem`) listed,
sized and streamed here, never copied whole; every prepare worker opens its own stream.
"""

import gzip
import io
import os

from kroberta.storage import filesystem, is_url


def size(path: str) -> int:
    """An input's size in bytes."""
    if is_url(path):
        fs, inside = filesystem(path)
        return int(fs.size(inside))
    return os.path.getsize(path)


def open_input(path: str):
    """A seekable binary file object reading an input (a URL: streamed in blocks)."""
    if not is_url(path):
        return open(path, "rb")
    fs, inside = filesystem(path)
    return fs.open(inside, "rb", block_size=1 << 22)


def open_stream(path: str):
    """(raw file, binary stream of its bytes, gunzipped for a name ending in .gz): the raw
    file's position is the progress in bytes."""
    raw = open_input(path)
    if path.lower().endswith(".gz"):
        return raw, gzip.GzipFile(fileobj=raw, mode="rb")
    return raw, raw


def open_range(path: str, start: int, end: int | None):
    """(raw file, binary stream of bytes `start` to `end` (None: the end) of an input): a
    piece of a file cut into chunks (`kroberta.text.chunks`: never gzipped), or the whole
    file, `open_stream`, when `start` is 0 and `end` None; the raw file's position is the
    progress in bytes."""
    if not start and end is None:
        return open_stream(path)
    raw = open_input(path)
    end = size(path) if end is None else end
    return raw, io.BufferedReader(_Range(raw, start, end), 1 << 20)


class _Range(io.RawIOBase):
    """Bytes `start` to `end` of a binary file object, as a raw stream of their own."""

    def __init__(self, raw, start, end):
        raw.seek(start)
        self._raw, self._left = raw, end - start

    def readable(self):
        return True

    def readinto(self, buffer):
        data = self._raw.read(min(len(buffer), self._left))
        buffer[: len(data)] = data
        self._left -= len(data)
        return len(data)

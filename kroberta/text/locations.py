"""Where prepare's inputs live: local paths (the standard library), or URLs (gs://, any
fsspec filesystem: `kroberta.storage.filesystem`) globbed, sized and streamed here, never
copied whole; every prepare worker opens its own stream. Prepared data and tokenizers at
a URL (`isdir`, `files_under`, `open_binary`) are read through `tf.io.gfile`, as training
reads its records.
"""

import glob as globbing
import gzip
import io
import os

from kroberta.storage import filesystem, is_url


def _gfile():
    import tensorflow as tf

    return tf.io.gfile


def _url(like: str, path: str) -> str:
    """A path fsspec returned (`/bucket/a.txt`, `bucket/a.txt`), as a URL spelled like
    `like` (`memory://bucket/*`, `file:///tmp/*`)."""
    if is_url(path):
        return path
    protocol, rest = like.split("://", 1)
    return f"{protocol}://{path if rest.startswith('/') else path.lstrip('/')}"


def glob(pattern: str) -> list[str]:
    """Sorted matches of an input pattern; `**` recurses for local patterns."""
    if is_url(pattern):
        fs, path = filesystem(pattern)
        return sorted(_url(pattern, p) for p in fs.glob(path))
    return sorted(globbing.glob(pattern, recursive=True))


def input_isdir(path: str) -> bool:
    if is_url(path):
        fs, inside = filesystem(path)
        return fs.isdir(inside)
    return os.path.isdir(path)


def input_files_under(directory: str) -> list[str]:
    """Every file under an input URL directory, sorted."""
    fs, path = filesystem(directory)
    return sorted(_url(directory, p) for p in fs.find(path))


def isdir(path: str) -> bool:
    return _gfile().isdir(path) if is_url(path) else os.path.isdir(path)


def files_under(directory: str) -> list[str]:
    """Every file under a URL directory, sorted."""
    found = []
    for dirpath, _, filenames in _gfile().walk(directory):
        found.extend(f"{dirpath.rstrip('/')}/{name}" for name in filenames)
    return sorted(found)


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


def open_binary(path: str):
    """A binary file object to read `path` from (seek and tell work on both kinds)."""
    if not is_url(path):
        return open(path, "rb")
    return io.BufferedReader(_GFileReader(_gfile().GFile(path, "rb")), 1 << 20)


def open_stream(path: str):
    """(raw file, binary stream of its bytes, gunzipped for a name ending in .gz): the raw
    file's position is the progress in bytes."""
    raw = open_input(path)
    if path.lower().endswith(".gz"):
        return raw, gzip.GzipFile(fileobj=raw, mode="rb")
    return raw, raw


def open_range(path: str, start: int, end: int | None):
    """(raw file, binary stream of bytes `start` to `end` (None: the end) of an input that
    is not gzipped): a piece of a file cut into chunks (`kroberta.text.chunks`); the raw
    file's position is the progress in bytes."""
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
        buffer[:len(data)] = data
        self._left -= len(data)
        return len(data)


class _GFileReader(io.RawIOBase):
    """A `tf.io.gfile.GFile` as a standard raw stream (pyarrow and gzip want `closed`,
    `readinto`, `seekable`, which GFile lacks or answers its own way)."""

    def __init__(self, gfile):
        self._file = gfile

    def readable(self):
        return True

    def seekable(self):
        return True

    def readinto(self, buffer):
        data = self._file.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def seek(self, offset, whence=io.SEEK_SET):
        self._file.seek(offset, whence)
        return self._file.tell()

    def tell(self):
        return self._file.tell()

    def close(self):
        if not self.closed:
            self._file.close()
        super().close()

"""Where prepare's inputs and prepared directories live: local paths (the standard
library), or URLs (gs://, any fsspec filesystem: `kroberta.storage.filesystem`) listed,
sized and streamed here, never copied whole; every prepare worker opens its own stream.
"""

import gzip
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

"""Where prepare's inputs and prepared directories live: local paths (the standard
library), or URLs (gs://, any fsspec filesystem: `kroberta.storage.filesystem`) globbed,
sized and streamed here, never copied whole; every prepare worker opens its own stream.
"""

import glob as globbing
import gzip
import os

from kroberta.storage import filesystem, is_url


def _url(like: str, path: str) -> str:
    """A path fsspec returned (`/bucket/a.txt`, `bucket/a.txt`), as a URL spelled like
    `like` (`memory://bucket/*`, `file:///tmp/*`)."""
    if is_url(path):
        return path
    protocol, rest = like.split("://", 1)
    return f"{protocol}://{path if rest.startswith('/') else path.lstrip('/')}"


def glob(pattern: str) -> list[str]:
    """Sorted matches of an input pattern; `**` recurses for local patterns."""
    # A local pattern's matches keep its spelling (relative stays relative), which fsspec's
    # local filesystem would make absolute.
    if is_url(pattern):
        fs, path = filesystem(pattern)
        return sorted(_url(pattern, p) for p in fs.glob(path))
    return sorted(globbing.glob(pattern, recursive=True))


def files_under(directory: str) -> list[str]:
    """Every file under a URL directory, sorted (`kroberta.storage.isdir` says whether a
    path is one)."""
    fs, path = filesystem(directory)
    return sorted(_url(directory, p) for p in fs.find(path))


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

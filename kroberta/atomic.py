"""Files that appear whole or not at all: write under a temporary name, then rename.

A crash, a kill or an error mid-write leaves the old file (or none) under the final
name, never a partial one. The temporary name sits in the same directory (so the
rename is atomic on one filesystem), starts with `.tmp-` (hidden from globs such as
`*.tfrecord`, and what a run directory's clean-up removes) and keeps the final name's
ending, for writers that insist on one (Keras' `.weights.h5`).
"""

import contextlib
import os


def temporary_name(path) -> str:
    """`dir/.tmp-<pid>.<name>` for `dir/<name>`."""
    directory, name = os.path.split(os.fspath(path))
    return os.path.join(directory, f".tmp-{os.getpid()}.{name}")


@contextlib.contextmanager
def atomic_path(path):
    """Yields a temporary path to write; it becomes `path` when the block succeeds.

    On an exception (KeyboardInterrupt included) the temporary file is removed.
    """
    tmp = temporary_name(path)
    try:
        yield tmp
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    os.replace(tmp, path)


@contextlib.contextmanager
def atomic_write(path, mode: str = "w", **open_kwargs):
    """`open(path, mode)` that only shows the file under `path` once it is closed."""
    with atomic_path(path) as tmp:
        with open(tmp, mode, **open_kwargs) as f:
            yield f

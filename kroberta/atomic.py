"""Files that appear whole or not at all: write under a temporary name, then rename.

A crash, a kill or an error mid-write leaves the old file (or none) under the final
name, never a partial one. The temporary name sits in the same directory (so the
rename is atomic on one filesystem), starts with `.tmp-` (hidden from globs such as
`*.tfrecord`, and what a run directory's clean-up removes) and keeps the final name's
ending, for writers that insist on one (Keras' `.weights.h5`). The file it becomes
has the mode `open()` gives a new file (0644 under umask 022), also where the writer
made it private (safetensors' `save_file` creates 0600 files).
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
    if os.path.isfile(tmp):
        os.chmod(tmp, 0o666 & ~umask())
    os.replace(tmp, path)


def umask() -> int:
    """The process's umask, read without changing it where Linux shows it (another thread
    creating a file meanwhile would get the wrong mode); else set and restored."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_write(path, mode: str = "w", **open_kwargs):
    """`open(path, mode)` that only shows the file under `path` once it is closed."""
    with atomic_path(path) as tmp:
        with open(tmp, mode, **open_kwargs) as f:
            yield f

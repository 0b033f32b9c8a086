"""Files on a local path or on any fsspec URL (gs://, s3://, memory://): the one storage
layer for run directories, prepared data (manifests, tokenizers), prepare's inputs and
outputs; only TensorFlow's record reading (tf.data) goes through its own filesystem.

A local path goes through os, open and shutil, exactly as before URLs were allowed
(whole-file writes through `kroberta.atomic`'s rename), without importing fsspec. A URL
goes through fsspec. Object stores have neither append nor rename, so on a URL a
file is always written whole at its final name: an object write is atomic (the
object appears whole or not at all), an append rewrites the whole (small) file, and
a directory that must appear complete (a checkpoint) is uploaded with its marker
file last (`put_tree`).

Files that only a local path can hold for their writer or reader (Keras' .h5
weights, Orbax's checkpoints, a picture) go through a local temporary copy:
`local_copy` to read, `staged_file` to write.
"""

import contextlib
import errno
import glob as globbing
import os
import posixpath
import shutil
import tempfile

from kroberta.atomic import atomic_path, atomic_write
from kroberta.errors import (
    ArgumentKindError,
    ConfigError,
    InputError,
    KrobertaError,
    NotFoundError,
    StorageError,
)

# The extra that installs each protocol's fsspec implementation, for the error that names it.
EXTRAS = {"gs": ("gcs", "gcsfs"), "gcs": ("gcs", "gcsfs")}
# Object stores: no directories to make (gcsfs's makedirs would even create a missing bucket).
OBJECT_STORES = {"gs", "gcs", "s3", "s3a", "az", "abfs", "abfss"}


def is_url(path) -> bool:
    return "://" in os.fspath(path)


def join(base, *parts) -> str:
    base = os.fspath(base)
    if is_url(base):
        return posixpath.join(base, *parts)
    return os.path.join(base, *parts)


def basename(path) -> str:
    path = os.fspath(path)
    return posixpath.basename(path.rstrip("/")) if is_url(path) else os.path.basename(path)


def absolute(path) -> str:
    """A local path made absolute; a URL as it is (it has no working directory)."""
    return path if is_url(path) else os.path.abspath(path)


def filesystem(url):
    """(fsspec filesystem, path inside it) for `url`; a one-line StorageError naming the
    URL and what to install when its implementation is missing."""
    url = os.fspath(url)
    protocol = url.split("://", 1)[0]
    extra, package = EXTRAS.get(protocol, (None, None))
    install = f'pip install "kroberta[{extra}]"' if extra else "pip install fsspec"
    import fsspec  # start-up time: only a URL needs it

    try:
        # A local file:// tree needs its directories made, as an object store does not.
        options = {"auto_mkdir": True} if protocol in ("file", "local") else {}
        fs, path = fsspec.core.url_to_fs(url, **options)
    except ImportError:
        package = package or f"the fsspec implementation of {protocol}://"
        raise StorageError(f"{url} needs {package}; {install}") from None
    except ValueError as error:  # an unknown protocol
        raise StorageError(f"{url}: {error}") from None
    return fs, path


def _as_url(like: str, path: str) -> str:
    """A path fsspec returned (`/bucket/a.txt`, `bucket/a.txt`), as a URL spelled like
    `like` (`memory://bucket/*`, `file:///tmp/*`)."""
    if is_url(path):
        return path
    protocol, rest = like.split("://", 1)
    return f"{protocol}://{path if rest.startswith('/') else path.lstrip('/')}"


def glob(pattern, recursive: bool = False, include_hidden: bool = False) -> list[str]:
    """The paths `pattern` matches, sorted. A local pattern goes through Python's glob
    (`recursive`: `**` recurses; `include_hidden`: `*` matches hidden files), whose
    matches keep the pattern's spelling (relative stays relative, where fsspec's local
    filesystem would make them absolute); a URL's through its filesystem (`**` recurses,
    `*` matches hidden files), spelled as URLs."""
    pattern = os.fspath(pattern)
    if not is_url(pattern):
        return sorted(globbing.glob(pattern, recursive=recursive, include_hidden=include_hidden))
    fs, path = filesystem(pattern)
    return sorted(_as_url(pattern, p) for p in fs.glob(path))


def files_under(directory) -> list[str]:
    """Every file under `directory` (at any depth), sorted; [] when there is none."""
    directory = os.fspath(directory)
    if not is_url(directory):  # the local spelling kept (relative stays relative)
        return sorted(
            os.path.join(folder, name) for folder, _, names in os.walk(directory) for name in names
        )
    fs, path = filesystem(directory)
    return sorted(_as_url(directory, p) for p in fs.find(path))


def _fresh(path):
    """(filesystem, path) with its cached listings of `path` dropped: another process (a
    killed run, a resumed one) may have written there since."""
    fs, p = filesystem(path)
    fs.invalidate_cache(p)
    return fs, p


def _ask(path, question: str) -> bool:
    """os.path's `question` of a local path; the filesystem's of a URL."""
    if not is_url(path):
        return getattr(os.path, question)(path)
    fs, p = _fresh(path)
    return getattr(fs, question)(p)


def exists(path) -> bool:
    return _ask(path, "exists")


def isfile(path) -> bool:
    return _ask(path, "isfile")


def isdir(path) -> bool:
    # An object store has no directories: one exists when objects lie under it.
    return _ask(path, "isdir")


def listdir(path) -> list[str]:
    """The names in a directory, sorted; [] when it does not exist."""
    if not is_url(path):
        return sorted(os.listdir(path)) if os.path.isdir(path) else []
    fs, p = _fresh(path)
    try:
        entries = fs.ls(p, detail=False)
    except FileNotFoundError:
        return []
    return sorted({posixpath.basename(e.rstrip("/")) for e in entries} - {""})


def makedirs(path):
    """Creates a directory (with its parents) where the filesystem has directories; an
    object store has none (objects make their prefixes)."""
    path = os.fspath(path)
    if not is_url(path):
        os.makedirs(path, exist_ok=True)
        return
    if path.split("://", 1)[0] in OBJECT_STORES:
        filesystem(path)  # a missing package is still named here, before any work
        return
    fs, p = filesystem(path)
    fs.makedirs(p, exist_ok=True)


def remove(path):
    """Removes a file if it exists."""
    if not is_url(path):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
        return
    fs, p = filesystem(path)
    with contextlib.suppress(FileNotFoundError):
        fs.rm_file(p)


def rmtree(path):
    """Removes a directory and everything in it, if it exists."""
    if not is_url(path):
        shutil.rmtree(path, ignore_errors=True)
        return
    fs, p = filesystem(path)
    with contextlib.suppress(FileNotFoundError):
        fs.rm(p, recursive=True)


def open_file(path, mode: str = "r", **kwargs):
    """`open` for a path or a URL (for a URL, writing creates the object on close)."""
    if not is_url(path):
        return open(path, mode, **kwargs)
    fs, p = filesystem(path)
    return fs.open(p, mode, **kwargs)


def read_text(path) -> str:
    with open_file(path, "r", encoding="utf-8") as f:
        return f.read()


def read_bytes(path) -> bytes:
    with open_file(path, "rb") as f:
        return f.read()


def write_bytes(path, data: bytes):
    """Writes a whole file that appears complete or not at all (local: a rename; URL:
    one object write)."""
    if not is_url(path):
        with atomic_write(path, "wb") as f:
            f.write(data)
        return
    fs, p = filesystem(path)
    fs.pipe_file(p, data)


def write_text(path, text: str):
    write_bytes(path, text.encode("utf-8"))


class Appender:
    """A file written line by line that survives a kill with the lines written so far.

    Local: opened for appending and flushed per line. URL (no append on object
    stores): the whole file is rewritten per line; a kill leaves the previous whole
    version. For small files only (metrics.jsonl: a row per log interval).
    """

    def __init__(self, path):
        self.path = path
        self._url = is_url(path)
        if self._url:
            self._text = read_text(path) if isfile(path) else ""
            if self._text and not self._text.endswith("\n"):
                self._text += "\n"
        else:
            self._file = open(path, "a")

    def write(self, line: str):
        if self._url:
            self._text += line
            write_text(self.path, self._text)
        else:
            self._file.write(line)
            self._file.flush()

    def close(self):
        if not self._url:
            # Each line was flushed by `write`: a close that fails (a full disk) only
            # repeats the error that write raised, and would hide it.
            with contextlib.suppress(OSError):
                self._file.close()


def append_text(path, text: str):
    """Appends `text` to a (small) file; on a URL the file is rewritten whole."""
    with contextlib.closing(Appender(path)) as appender:
        appender.write(text)


def staging_dir(url, name: str) -> str | None:
    """A new local directory to write `url`'s files into before `put_tree`, or None
    when `url` is a local path (written in place)."""
    return tempfile.mkdtemp(prefix=f"kroberta-{name}-") if is_url(url) else None


def put_tree(local_dir, url: str, last: str | None = None, remove: bool = False):
    """Uploads a local directory's files under `url`; the file named `last` (relative to
    `local_dir`) goes up after all the others, so its presence marks the copy complete.
    `remove`: the local directory is deleted after the upload."""
    fs, root = filesystem(url)
    files = []
    for dirpath, _, filenames in os.walk(local_dir):
        files.extend(os.path.relpath(os.path.join(dirpath, f), local_dir) for f in filenames)
    files.sort(key=lambda f: (f == last, f))
    for relative in files:
        fs.put_file(
            os.path.join(local_dir, relative), posixpath.join(root, *relative.split(os.sep))
        )
    if remove:
        shutil.rmtree(local_dir, ignore_errors=True)


def get_tree(url: str, local_dir):
    """Downloads every file under `url` into `local_dir`."""
    fs, root = _fresh(url)
    root = root.rstrip("/")
    for remote in fs.find(root):
        relative = remote[len(root) :].lstrip("/")
        target = os.path.join(local_dir, *relative.split("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        fs.get_file(remote, target)


@contextlib.contextmanager
def local_copy(path):
    """Yields a local path holding `path`'s file or directory: `path` itself when local,
    else a temporary download removed after the block."""
    if not is_url(path):
        yield path
        return
    if not exists(path):
        raise NotFoundError(f"{path}: no such file or directory")
    with tempfile.TemporaryDirectory(prefix="kroberta-") as tmp:
        target = os.path.join(tmp, basename(path) or "copy")
        if isdir(path):
            get_tree(path, target)
        else:
            fs, p = filesystem(path)
            fs.get_file(p, target)
        yield target


@contextlib.contextmanager
def staged_file(path):
    """Yields a local path to write; it becomes `path` when the block succeeds (local: a
    rename, `kroberta.atomic`; URL: one upload of the finished file)."""
    if not is_url(path):
        with atomic_path(path) as tmp:
            yield tmp
        return
    with tempfile.TemporaryDirectory(prefix="kroberta-") as tmp:
        # The final name's ending, for writers that insist on one (Keras' .weights.h5).
        local = os.path.join(tmp, basename(path))
        yield local
        fs, p = filesystem(path)
        fs.put_file(local, p)


def free_bytes(path) -> int:
    """Free space where `path`'s files are written first: the disk holding `path`, or for a
    URL the local temporary directory that stages its checkpoints and weights."""
    return shutil.disk_usage(tempfile.gettempdir() if is_url(path) else path).free


def weights_bytes(weights) -> int:
    """The bytes of `weights` (variables or arrays: their shapes and dtypes)."""
    import numpy as np  # start-up: the commands read this module before NumPy is needed

    return sum(int(np.prod(w.shape)) * np.dtype(w.dtype).itemsize for w in weights)


def check_room(path, needed_bytes: int, what: str, key: str | None = None):
    """Refuses a write when the disk that is to hold `path` (or, for a URL, the local
    temporary directory that stages it) has less than `needed_bytes` free. `what`: what is
    written, in words.

    With `key` (the config key that names `path`), a check before any work: a ConfigError
    that names the place, both sizes and the fix. Without, the check of a writer that cannot
    fail cleanly on a full disk: OSError(ENOSPC), which `writing` turns into one line (h5py,
    under Keras' .weights.h5, fails again in each object's finalizer, a screen of "Exception
    ignored" tracebacks, then the process dies of a segmentation fault; Orbax's tensorstore
    threads print "Event loop is closed" tracebacks)."""
    free = free_bytes(_existing_folder(path))
    if free >= needed_bytes:
        return
    needs = f"{what} needs about {needed_bytes / 2**20:.1f} MiB"
    if key is None:
        raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)}: {needs}")
    where = (
        f"the temporary directory that stages its files ({tempfile.gettempdir()}; set TMPDIR)"
        if is_url(path)
        else path
    )
    raise ConfigError(
        f"{key}: {where} has {free / 2**20:.1f} MiB free but {needs}; "
        f"free some space or choose another --{key}"
    )


def check_room_for_hdf5(path, weights):
    """`check_room` for an HDF5 weights file of `weights`: their bytes, a tenth more, and
    8 KiB of layout per array (the tiny model's 41 arrays of 0.14 MiB took 0.24 MiB)."""
    weights = list(weights)
    check_room(
        path, int(1.1 * weights_bytes(weights)) + 8 * 2**10 * (len(weights) + 8), "the weights file"
    )


def check_writable(path, key: str, folder: bool = False):
    """Refuses, before any work, an output `path` that could not be written, in one line
    naming `key` (the option or config key that gives it), the place at fault and what to
    do. Local: the nearest existing folder that would hold `path` (and `path` itself when it
    is a folder) must be a writable folder; `folder`: `path` is a folder written into (a run
    directory), a file there is refused too. A URL: an object is written in its folder and
    removed (a missing filesystem package, credentials and permissions found now)."""
    if is_url(path):
        try:
            filesystem(path)  # a missing package named for `path`, not for the probe
            probe = join(path if folder else posixpath.dirname(path), f".write-test-{os.getpid()}")
            write_text(probe, "ok")
            remove(probe)
        except StorageError as error:  # the URL's filesystem package is missing
            raise StorageError(f"{key}: {error}") from None
        except OSError as error:
            raise StorageError(
                f"{key} {path}: not writable ({error.strerror or error}); choose another {key}"
            ) from None
        return
    path = os.path.abspath(path)
    itself = [path] if os.path.isdir(path) or folder and os.path.exists(path) else []
    for place in dict.fromkeys([_existing_folder(os.path.dirname(path)), *itself]):
        if os.path.isdir(place) and os.access(place, os.W_OK):
            continue
        why = (
            "a file, not a folder"
            if not os.path.isdir(place)
            else "on a read-only file system"
            if os.statvfs(place).f_flag & os.ST_RDONLY
            else "not writable (permission denied)"
        )
        raise StorageError(f"{key} {path}: {place} is {why}; choose another {key}")


def _existing_folder(path):
    """`path` or its nearest existing parent (a URL as it is)."""
    if is_url(path):
        return path
    folder = os.path.abspath(os.fspath(path))
    while not os.path.exists(folder) and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
    return folder


def free_text(path) -> str:
    """The free space on the disk that holds `path` (or its nearest existing parent), in
    words, for a message about a failed write; "" where it cannot be read."""
    try:
        return f"{free_bytes(_existing_folder(path)) / 2**20:.1f} MiB free there"
    except OSError:
        return ""


@contextlib.contextmanager
def writing(path, what: str = "file", then: str = ""):
    """An OSError writing the `what` at `path` (a full disk, a read-only directory, a quota)
    becomes one StorageError naming the path, the reason and the free space, so that the
    command exits 2 with one line; `then` says what to do ("a re-run resumes from ...").
    kroberta's own errors pass as they are."""
    try:
        yield
    except KrobertaError:
        raise
    except OSError as error:
        reason = error.strerror or str(error)
        free = free_text(path)
        raise StorageError(
            f"could not write the {what} at {path}: {reason}"
            + (f" ({free})" if free else "")
            + (f"; {then}" if then else "")
        ) from None


def directory_argument(path, function: str, what: str = "directory") -> str:
    """A public function's directory argument as a str: anything but a path (a model
    included), or a file's path, refused with what to give instead. `what`: the kind of
    directory the messages name ("run directory")."""
    if not isinstance(path, (str, os.PathLike)):
        raise ArgumentKindError(
            f"{function}: expected a {what}'s path, got "
            f"{type(path).__name__}"
            + (" (a model already: use it as it is)" if hasattr(path, "predict") else "")
        )
    path = os.fspath(path)
    if isfile(path):
        raise NotFoundError(
            f"{path}: a file, not a {what}; give the directory that holds it "
            f"({os.path.dirname(path) or '.'})"
        )
    return path


@contextlib.contextmanager
def reading(path, what: str = "file"):
    """A library's error reading the `what` at `path` becomes one InputError naming it:
    h5py's OSError on a truncated .h5, Orbax's ValueError on a damaged checkpoint, Keras'
    ValueError on weights of another shape. kroberta's own errors pass as they are."""
    try:
        yield
    except KrobertaError:
        raise
    except (OSError, ValueError) as error:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise InputError(
            f"{path}: cannot read this {what}: damaged, truncated or not this "
            f"model's ({first[:300]})"
        ) from None

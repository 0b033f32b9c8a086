"""kroberta.storage: the same file operations on local paths and on fsspec URLs (memory://)."""

import os
import subprocess
import sys
import uuid

import pytest

from kroberta import storage
from kroberta.data.file_patterns import resolve_files
from kroberta.errors import StorageError
from tests.conftest import REPO


@pytest.fixture
def url():
    """A fresh directory on fsspec's in-process memory filesystem."""
    return f"memory://kroberta-test-{uuid.uuid4().hex[:8]}/run"


@pytest.mark.parametrize("where", ["local", "url"])
@pytest.mark.fast
def test_files_read_write_append_list_and_remove_alike(where, url, tmp_path):
    root = str(tmp_path / "run") if where == "local" else url
    storage.makedirs(root)
    path = storage.join(root, "a.txt")
    assert not storage.exists(path) and storage.listdir(root) == []
    storage.write_text(path, "one\n")
    storage.append_text(path, "two\n")
    appender = storage.Appender(path)
    appender.write("three\n")
    assert storage.read_text(path) == "one\ntwo\nthree\n"  # each line there before close
    appender.close()
    storage.makedirs(storage.join(root, "sub"))
    storage.write_text(storage.join(root, "sub", "b.txt"), "b\n")
    assert storage.listdir(root) == ["a.txt", "sub"]
    assert storage.isdir(storage.join(root, "sub")) and storage.isfile(path)
    assert storage.read_bytes(path) == b"one\ntwo\nthree\n"
    storage.remove(path)
    storage.remove(path)  # a missing file is no error
    storage.rmtree(storage.join(root, "sub"))
    assert storage.listdir(root) == [] and storage.listdir(storage.join(root, "none")) == []


@pytest.mark.fast
def test_a_url_file_missing_its_last_newline_gets_one_before_the_next_line(url):
    # A kill during a local append leaves a cut line; later rows must start on a new line.
    path = storage.join(url, "metrics.jsonl")
    storage.write_text(path, '{"step": 1}\n{"st')
    storage.append_text(path, '{"step": 2}\n')
    assert storage.read_text(path) == '{"step": 1}\n{"st\n{"step": 2}\n'


@pytest.mark.fast
def test_put_tree_uploads_the_marker_last_and_get_tree_brings_it_back(url, tmp_path, monkeypatch):
    local = tmp_path / "step"
    (local / "state" / "d").mkdir(parents=True)
    for name in ("_CHECKPOINT_METADATA", "a", "state/d/x", "state/z"):
        (local / name).write_text(name)
    fs, _ = storage.filesystem(url)
    order = []
    put_file = fs.put_file
    monkeypatch.setattr(
        fs,
        "put_file",
        lambda lpath, rpath, **kw: (
            order.append(os.path.relpath(lpath, local)),
            put_file(lpath, rpath, **kw),
        )[1],
    )
    storage.put_tree(str(local), storage.join(url, "step"), last="_CHECKPOINT_METADATA")
    assert order[-1] == "_CHECKPOINT_METADATA" and len(order) == 4
    with storage.local_copy(storage.join(url, "step")) as copy:
        assert open(os.path.join(copy, "state", "d", "x")).read() == "state/d/x"
        assert sorted(os.listdir(copy)) == ["_CHECKPOINT_METADATA", "a", "state"]


@pytest.mark.fast
def test_staged_file_appears_only_when_the_block_succeeds(url):
    path = storage.join(url, "model.weights.h5")
    with pytest.raises(RuntimeError):
        with storage.staged_file(path) as local:
            assert local.endswith("model.weights.h5")  # writers that insist on an ending
            open(local, "w").write("partial")
            raise RuntimeError
    assert not storage.exists(path)
    with storage.staged_file(path) as local:
        open(local, "w").write("whole")
    assert storage.read_text(path) == "whole"


def _errors_without_gcsfs(setup: str) -> tuple[list[str], str]:
    """(the error each of `setup`'s `calls` (function, argument) raises, as "Class message"
    lines; stderr), in a process where gcsfs is hidden from the import system: fsspec
    knows gs:// but cannot load it."""
    code = (
        "import sys; sys.modules['gcsfs'] = None\n" + setup + "for call, arg in calls:\n"
        "    try:\n        call(arg)\n"
        "    except Exception as e:\n        print(type(e).__name__, e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    return out.stdout.splitlines(), out.stderr


def test_a_missing_filesystem_package_is_one_line_naming_the_extra():
    lines, stderr = _errors_without_gcsfs(
        "from kroberta import storage\n"
        "run_dir = lambda path: storage.check_writable(path, 'run_dir', folder=True)\n"
        "calls = ((storage.isdir, 'gs://bucket/run'), (run_dir, 'gs://bucket/run'),\n"
        "         (lambda path: storage.check_writable(path, '--out'), 'gs://bucket/p.npz'))\n"
    )
    assert lines == [
        'StorageError gs://bucket/run needs gcsfs; pip install "kroberta[gcs]"',
        # What training and predict say before any compute (exit status 2 from the command).
        'StorageError run_dir: gs://bucket/run needs gcsfs; pip install "kroberta[gcs]"',
        'StorageError --out: gs://bucket/p.npz needs gcsfs; pip install "kroberta[gcs]"',
    ], stderr[-2000:]


@pytest.mark.fast
def test_an_output_where_a_file_stands_for_a_folder_is_refused_naming_both(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    cases = (
        (blocker / "p.npz", "--out", False),
        (blocker / "run", "run_dir", True),
        (blocker, "run_dir", True),
    )
    for path, key, folder in cases:
        with pytest.raises(StorageError) as raised:
            storage.check_writable(path, key, folder=folder)
        assert str(raised.value) == (
            f"{key} {path}: {blocker} is a file, not a folder; choose another {key}"
        )
    storage.check_writable(blocker, "--out")  # a file output replaced: its folder counts
    storage.check_writable(tmp_path / "new" / "run", "run_dir", folder=True)
    assert os.listdir(tmp_path) == ["a_file"]  # a local check makes nothing


@pytest.mark.fast
def test_a_url_run_dir_is_probed_and_left_as_it_was(url):
    storage.check_writable(url, "run_dir", folder=True)
    assert storage.listdir(url) == []


@pytest.mark.fast
def test_local_paths_keep_their_meaning():
    assert storage.join("runs", "a") == os.path.join("runs", "a")
    assert storage.absolute("runs/a") == os.path.abspath("runs/a")
    assert storage.absolute("gs://b/runs/a") == "gs://b/runs/a"
    assert storage.basename("gs://b/runs/a/") == "a"


@pytest.mark.parametrize("where", ["local", "url"])
@pytest.mark.fast
def test_globs_and_listings_alike(where, url, tmp_path):
    root = str(tmp_path / "run") if where == "local" else url
    storage.makedirs(storage.join(root, "sub"))
    for name in ("a.tfrecord", ".hidden.tfrecord", "b.txt", "sub/c.tfrecord"):
        storage.write_text(storage.join(root, name), name)
    assert storage.files_under(root) == [
        storage.join(root, n) for n in (".hidden.tfrecord", "a.tfrecord", "b.txt", "sub/c.tfrecord")
    ]
    # Hidden files match `*` as TensorFlow's glob matches them (kroberta.data.file_patterns).
    assert resolve_files([storage.join(root, "*.tfrecord")], "data.train") == (
        storage.join(root, ".hidden.tfrecord"),
        storage.join(root, "a.tfrecord"),
    )
    assert storage.glob(storage.join(root, "**", "*.tfrecord"), recursive=True)[-1] == storage.join(
        root, "sub", "c.tfrecord"
    )
    assert storage.files_under(storage.join(root, "none")) == []


def test_prepared_data_on_gs_without_gcsfs_is_one_line_naming_the_extra():
    # Manifests, tokenizers and record patterns go through kroberta.storage like a run directory.
    lines, stderr = _errors_without_gcsfs(
        "from kroberta.data.file_patterns import resolve_files\n"
        "from kroberta.data.manifest import load_manifest\n"
        "from kroberta.text.tokenizer import load_tokenizer\n"
        "calls = ((load_manifest, 'gs://b/data'), (load_tokenizer, 'gs://b/t.json'),\n"
        "         (lambda p: resolve_files([p], 'data.train'), 'gs://b/*.tfrecord'))\n"
    )
    assert lines == [
        'StorageError gs://b/data/manifest.json needs gcsfs; pip install "kroberta[gcs]"',
        'StorageError gs://b/t.json needs gcsfs; pip install "kroberta[gcs]"',
        'StorageError gs://b/*.tfrecord needs gcsfs; pip install "kroberta[gcs]"',
    ], stderr[-2000:]


@pytest.mark.fast
def test_check_room_names_what_is_short_where_and_the_fix(tmp_path, url, monkeypatch):
    import errno
    import tempfile

    from kroberta.errors import ConfigError

    storage.check_room(tmp_path / "new" / "file", 2**20, "a file")  # room: nothing raised
    monkeypatch.setattr(storage, "free_bytes", lambda path: 2**20)
    # A writer's check: ENOSPC with the size, which `writing` makes one line.
    with pytest.raises(OSError) as error:
        storage.check_room(tmp_path / "ckpt", 3 * 2**20, "a checkpoint")
    assert (error.value.errno, error.value.strerror) == (
        errno.ENOSPC,
        f"{os.strerror(errno.ENOSPC)}: a checkpoint needs about 3.0 MiB",
    )
    # Before any work: the key, the place and both sizes.
    with pytest.raises(ConfigError) as error:
        storage.check_room(str(tmp_path), 3 * 2**20, "a checkpoint", key="run_dir")
    assert str(error.value) == (
        f"run_dir: {tmp_path} has 1.0 MiB free but a checkpoint needs about 3.0 MiB; "
        "free some space or choose another --run_dir"
    )
    # A URL is staged in the temporary directory: the message names it, and TMPDIR.
    with pytest.raises(ConfigError) as error:
        storage.check_room(url, 3 * 2**20, "a checkpoint", key="run_dir")
    assert str(error.value).startswith(
        "run_dir: the temporary directory that stages its files "
        f"({tempfile.gettempdir()}; set TMPDIR) has 1.0 MiB free"
    )

"""`python -m kroberta.prepare` under real faults: a worker killed with SIGKILL, the command
killed, SIGINT and SIGTERM to it or to its process group, a full disk and a read-only --out
(a real small filesystem). Each ends with one line and its exit code, no traceback, and the
same command then resumes to the files of a run never stopped."""

import errno
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from kroberta.text.chunks import Chunk
from kroberta.text.textfiles import Source
from kroberta.text.work_dir import WorkDir
from tests.text.test_prepare import REPO, make_docs, write_corpus
from tests.text.test_prepare_workers import _files

# The command itself, with small chunks (prepare's floor of 1 MB per chunk lowered: its
# rule of 1/64 of the corpus then cuts ~70 KB into ~60 chunks) and, where asked, a gate
# that holds the chunks GATE names (comma-separated indices) until GATE_DIR/release
# exists, after writing GATE_DIR/started-<index> with the worker's pid.
_COMMAND = """
import errno, os, sys, time
import kroberta.text.build as build
import kroberta.text.workers as workers
from kroberta.cli.prepare import main
build.MIN_CHUNK_BYTES = 1
real_chunk, gated, marks = workers.prepare_chunk, os.environ.get("GATE", ""), os.environ.get("GATE_DIR")
def prepare_chunk(job, tok, chunk, on_bytes=None):
    if str(chunk.index) == os.environ.get("EXIT_IN_CHUNK"):
        os._exit(3)  # a crash in C code, or a library that exits
    if str(chunk.index) in gated.split(","):
        with open(os.path.join(marks, f"started-{chunk.index}"), "w") as f:
            f.write(str(os.getpid()))
        while not os.path.exists(os.path.join(marks, "release")):
            time.sleep(0.05)
    return real_chunk(job, tok, chunk, on_bytes)
workers.prepare_chunk = prepare_chunk
if os.environ.get("STOP_BEFORE_ASSEMBLY"):  # every chunk done, nothing assembled
    def stop(*args, **kwargs):
        raise KeyboardInterrupt
    build.assemble_splits = stop
if os.environ.get("FULL_AFTER_WRITES"):  # where no filesystem can be mounted: a full disk told by Python
    import kroberta.data.tfrecord_files as files
    real_write, writes = files.RecordFileWriter.write_many, []
    def write_many(self, records):
        writes.append(1)
        if len(writes) > int(os.environ["FULL_AFTER_WRITES"]):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(self, records)
    files.RecordFileWriter.write_many = write_many
sys.exit(main(sys.argv[1:]))
"""

HANG = 60  # seconds after which a command that should have ended is taken to hang


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    write_corpus(root / "a.txt", make_docs(700, seed=1))
    write_corpus(root / "b.txt", make_docs(300, seed=2))
    return str(root / "*.txt")


def _arguments(corpus, out, workers):
    return [
        "--input",
        corpus,
        "--out",
        str(out),
        "--vocab-size",
        "300",
        "--seq-len",
        "16",
        "--validation-fraction",
        "0.1",
        "--tokenizer-sample-bytes",
        "20000",
        "--workers",
        str(workers),
        "--no-progress",
    ]


def _start(corpus, out, workers=2, gate_dir=None, gate=(), **env):
    extra = {"GATE": ",".join(map(str, gate)), "GATE_DIR": str(gate_dir)} if gate else {}
    return subprocess.Popen(
        [sys.executable, "-c", _COMMAND, *_arguments(corpus, out, workers)],
        env={**os.environ, "PYTHONPATH": REPO, **extra, **env},
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )  # its own process group, as a shell job is


def _run(corpus, out, workers=2, **env):
    process = _start(corpus, out, workers, **env)
    stdout, stderr = process.communicate(timeout=HANG * 5)
    return process.returncode, stdout, stderr


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
    """The files of a prepare never stopped."""
    out = tmp_path_factory.mktemp("reference") / "out"
    code, _, stderr = _run(corpus, out)
    assert code == 0, stderr
    files = _files(out)
    assert files["manifest.json"]["source"]["chunks"] > 20, "many chunks"
    return files


def _wait_for_gate(process, gate_dir, gate):
    """{chunk index: pid of the worker holding it} once every gated chunk is held."""
    deadline = time.monotonic() + HANG * 3
    while time.monotonic() < deadline:
        started = {i: gate_dir / f"started-{i}" for i in gate}
        if all(p.exists() and p.read_text() for p in started.values()):
            return {i: int(p.read_text()) for i, p in started.items()}
        assert process.poll() is None, process.communicate()[1]
        time.sleep(0.05)
    process.kill()
    raise AssertionError("the gated chunks were never started")


def _ended(process, timeout=HANG):
    """(exit code, stderr) of `process`, which must end within `timeout` (no hang)."""
    try:
        _, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        raise AssertionError(
            f"still running {timeout} s after the fault: {process.communicate()[1]}"
        ) from None
    return process.returncode, stderr


def _the_line(stderr):
    """The one line the command ended with; no traceback, nothing else but warnings and
    the progress it logs ("resuming ...", "read N document(s) ...")."""
    assert "Traceback" not in stderr, stderr
    lines = [
        line
        for line in stderr.splitlines()
        if line and not line.startswith(("warning:", "resuming ", "read "))
    ]
    assert len(lines) == 1, stderr
    return lines[0]


def _gone(pids):
    """Waits until no process of `pids` runs (a zombie has ended); False after HANG s."""
    deadline = time.monotonic() + HANG
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                alive += [psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
            except psutil.NoSuchProcess:
                pass
        if not any(alive):
            return True
        time.sleep(0.1)
    return False


def _described(out, index):
    return WorkDir.of(out).load_plan().chunks[index].describe()


def _assert_resumes(corpus, out, reference):
    code, stdout, stderr = _run(corpus, out)
    assert code == 0, stderr
    assert "resuming" in stderr and stdout.startswith(f"prepared {out}")
    assert _files(out) == reference


def test_a_killed_worker_is_named_and_the_same_command_resumes(corpus, reference, tmp_path):
    out, gate_dir = tmp_path / "out", tmp_path / "gate"
    gate_dir.mkdir()
    process = _start(corpus, out, gate_dir=gate_dir, gate=(2, 3))
    holders = _wait_for_gate(process, gate_dir, (2, 3))
    assert holders[2] != holders[3] and set(holders.values()) <= {
        p.pid for p in psutil.Process(process.pid).children()
    }
    os.kill(holders[2], signal.SIGKILL)  # as the out-of-memory killer does
    code, stderr = _ended(process, timeout=10)
    line = _the_line(stderr)
    assert code == 2
    assert line == (
        f"error: a worker process was killed (signal 9) while preparing {_described(out, 2)}: "
        f"out of memory? lower --workers; {_described(out, 3)} was running too; the finished "
        f"chunks are kept in {out}/.prepare: the same command resumes"
    )
    assert "bytes " in _described(out, 2), "the chunk's byte range"
    assert _gone(holders.values()), "the other worker stopped"
    assert os.listdir(out) == [".prepare"]
    _assert_resumes(corpus, out, reference)


@pytest.mark.slow
def test_a_worker_that_exits_is_named_with_its_exit_code(corpus, tmp_path):
    out = tmp_path / "out"
    code, _, stderr = _run(corpus, out, EXIT_IN_CHUNK="5")
    assert code == 2
    line = _the_line(stderr)
    assert line.startswith(
        f"error: a worker process exited (code 3) while preparing {_described(out, 5)}"
    )
    assert line.endswith(
        f"the finished chunks are kept in {out}/.prepare: the same command resumes"
    )


@pytest.mark.fast
def test_a_chunk_is_described_by_its_files_and_byte_ranges():
    piece = Chunk(7, (Source("c/a.txt", start=2048, end=4096),), (2048,))
    assert piece.describe() == "chunk 7 (c/a.txt bytes 2048-4096)"
    last = Chunk(8, (Source("c/a.txt", start=4096), Source("c/b.jsonl", "jsonl")), (100, 50))
    assert last.describe() == "chunk 8 (c/a.txt bytes 4096-4196, c/b.jsonl)"
    many = Chunk(0, tuple(Source(f"c/{i}.txt") for i in range(5)), (10,) * 5)
    assert many.describe() == "chunk 0 (c/0.txt, c/1.txt and 3 more file(s))"


@pytest.mark.slow
@pytest.mark.parametrize(
    "signum, code, words",
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "stopped by SIGTERM")],
)
@pytest.mark.parametrize("to_group", [True, False], ids=["group", "process"])
def test_sigint_and_sigterm_end_prepare_with_one_line(
    corpus, tmp_path, signum, code, words, to_group
):
    out, gate_dir = tmp_path / "out", tmp_path / "gate"
    gate_dir.mkdir()
    process = _start(corpus, out, gate_dir=gate_dir, gate=(2, 3))
    holders = _wait_for_gate(process, gate_dir, (2, 3))  # both workers mid-chunk
    (os.killpg if to_group else os.kill)(process.pid, signum)
    ended, stderr = _ended(process, timeout=10)
    assert ended == code
    assert _the_line(stderr) == (
        f"{words}: no manifest written; the finished chunks are kept in {out}/.prepare: "
        "the same command resumes, --overwrite starts over"
    )
    assert _gone(holders.values())
    assert os.listdir(out) == [".prepare"]


@pytest.mark.slow
def test_a_killed_command_s_workers_finish_their_chunk_and_the_same_command_resumes(
    corpus, reference, tmp_path
):
    out, gate_dir = tmp_path / "out", tmp_path / "gate"
    gate_dir.mkdir()
    process = _start(corpus, out, gate_dir=gate_dir, gate=(2, 3))
    holders = _wait_for_gate(process, gate_dir, (2, 3))
    process.kill()
    # Its workers hold its stderr open until they exit: the exit code alone, for now.
    assert process.wait(timeout=HANG) == -signal.SIGKILL
    (gate_dir / "release").touch()
    assert _gone(holders.values()), "orphaned workers exit"
    assert "Traceback" not in process.communicate(timeout=HANG)[1]
    finished = {name for name in os.listdir(out / ".prepare") if name.endswith(".json")}
    assert {"chunk-000002.json", "chunk-000003.json"} <= finished, (
        "each finished the chunk it was on"
    )
    _assert_resumes(corpus, out, reference)


class SmallDisk:
    """A tmpfs of a few hundred KB mounted at `root` (root only; skips where refused)."""

    def __init__(self, root):
        self.root = root
        root.mkdir()
        self._mount("-t", "tmpfs", "-o", "size=256k", "tmpfs")
        self.mounted = True

    def _mount(self, *options):
        done = subprocess.run(["mount", *options, str(self.root)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(
                f"a small filesystem cannot be mounted here (mount {' '.join(options)}: "
                f"{done.stderr.strip()}); test_a_full_disk_told_by_python_where_no_filesystem_can_be_mounted "
                "stands in"
            )

    def resize(self, kilobytes):
        """Remounted with room for `kilobytes` in all; the files stay."""
        self._mount("-o", f"remount,rw,size={kilobytes}k")

    def read_only(self):
        self._mount("-o", "remount,ro")

    def used_kb(self):
        stat = os.statvfs(self.root)
        return (stat.f_blocks - stat.f_bfree) * stat.f_frsize // 1024

    def unmount(self):
        subprocess.run(["umount", str(self.root)], check=False)


@pytest.fixture
def small_disk(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root")
    disk = SmallDisk(tmp_path / "disk")
    yield disk
    disk.unmount()


def _no_partial_files(out):
    """Only the work directory, and in it no temporary file."""
    assert os.listdir(out) == [".prepare"]
    assert not [n for n in os.listdir(out / ".prepare") if n.startswith(".tmp-")]


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_a_full_disk_is_one_line_and_the_same_command_resumes_once_there_is_room(
    corpus, reference, small_disk, workers
):
    out = small_disk.root / "out"
    code, _, stderr = _run(corpus, out, workers)
    line = _the_line(stderr)
    assert code == 2
    assert line.startswith("error: could not write the ") and f" at {out}/.prepare/chunk-" in line
    assert ": No space left on device (" in line and " MiB free there); " in line
    assert line.endswith(f"it resumes from the finished chunks in {out}/.prepare")
    _no_partial_files(out)
    assert [
        n for n in os.listdir(out / ".prepare") if n.startswith("chunk-") and n.endswith(".json")
    ], "some chunks finished before the disk was full"
    small_disk.resize(16 << 10)
    _assert_resumes(corpus, out, reference)


@pytest.mark.slow
def test_a_full_disk_while_the_shards_are_joined(corpus, reference, small_disk):
    out = small_disk.root / "out"
    small_disk.resize(16 << 10)
    code, _, stderr = _run(corpus, out, STOP_BEFORE_ASSEMBLY="1")
    assert code == 130, stderr  # every chunk done, nothing joined yet
    small_disk.resize(small_disk.used_kb() + 8)  # no room for the train shard
    code, _, stderr = _run(corpus, out)
    assert code == 2
    assert _the_line(stderr).startswith(
        f"error: could not write the shard at {out}/train-00000-of-00001.tfrecord: "
        "No space left on device ("
    )
    _no_partial_files(out)
    small_disk.resize(16 << 10)
    _assert_resumes(corpus, out, reference)


@pytest.mark.slow
def test_a_read_only_out(corpus, reference, small_disk):
    out = small_disk.root / "out"
    small_disk.read_only()
    code, _, stderr = _run(corpus, out)
    assert code == 2
    assert _the_line(stderr).startswith(
        f"error: could not write the output directory at {out}: Read-only file system ("
    )
    assert not out.exists()
    small_disk.resize(16 << 10)
    code, _, stderr = _run(corpus, out)
    assert code == 0, stderr
    assert _files(out) == reference


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_a_full_disk_told_by_python_where_no_filesystem_can_be_mounted(
    corpus, reference, tmp_path, workers
):
    """The ENOSPC a write raises, from Python: the same line, in the worker or in the command."""
    out = tmp_path / "out"
    code, _, stderr = _run(corpus, out, workers, FULL_AFTER_WRITES="12")
    assert code == 2
    line = _the_line(stderr)
    assert f"could not write the records at {out}/.prepare/chunk-" in line
    assert f": {os.strerror(errno.ENOSPC)} (" in line and "MiB free there" in line
    _no_partial_files(out)
    _assert_resumes(corpus, out, reference)

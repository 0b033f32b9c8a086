"""The commands besides `train` and `prepare` under a real machine's faults, each injected
for real in a subprocess: SIGTERM and SIGINT (to the process or its group), a full disk
(a small tmpfs) and a read-only folder (a tmpfs mounted read-only). Each ends with its
exit code and one line on stderr, no traceback, no hang, nothing half-written at the
final name, and a re-run ends as an uninterrupted run does.

Mounting needs root (or CAP_SYS_ADMIN); where it is refused, the disk tests skip."""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.conftest import REPO, TINY_LENGTH, TINY_VOCAB
from tests.downstream.tasks import marker_task

TIMEOUT = 600  # seconds: no hang (JAX's start and compilation on a loaded machine)
STOP_TIMEOUT = 60  # seconds from the signal to the exit: no hang
TRIAL_WEIGHTS_BYTES = 152_490  # one trials/*.npz of the tiny model (measured)


def _command(name, *args):
    return [sys.executable, "-m", f"kroberta.{name}", *map(str, args)]


def _run(command, **kwargs):
    return subprocess.run(
        command,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env={**os.environ, "PYTHONPATH": REPO},
        **kwargs,
    )


def _one_line(stderr: str) -> str:
    """The command's last line, after asserting that stderr holds no traceback."""
    assert "Traceback" not in stderr, stderr[-3000:]
    assert "Exception ignored" not in stderr, stderr[-3000:]
    return stderr.strip().splitlines()[-1]


# --- the fixtures: a tiny run, its data, a labelled task, small and read-only disks ---------


@pytest.fixture(scope="module")
def files(downstream_model, tmp_path_factory):
    """The tiny model saved as a run, seed-format records it reads (its vocabulary: the
    tiny config's) and a small labelled task."""
    from kroberta.data.synthetic import write_seed_format
    from kroberta.training import final_model

    root = tmp_path_factory.mktemp("faults")
    final_model.save(downstream_model, str(root / "run"))
    records = root / "records.tfrecord"
    write_seed_format(str(records), 70, TINY_LENGTH, TINY_VOCAB, seed=9)
    train, validation = marker_task(root, train=128, validation=32)
    return {
        "run": root / "run",
        "records": records,
        "train": train,
        "validation": validation,
        "root": root,
    }


@contextlib.contextmanager
def _mounted(path, options: str):
    path.mkdir(exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


@pytest.fixture
def small_disk(tmp_path):
    """A function that mounts a tmpfs of `size` (mount(8)'s words: "250k") at a fresh
    folder and returns it, with `grow(size)` to free space (a remount); unmounted after."""
    stack = contextlib.ExitStack()

    def mount(size: str):
        return stack.enter_context(_mounted(tmp_path / f"disk-{size}", f"size={size}"))

    with stack:
        yield mount


def _grow(disk, size: str):
    subprocess.run(["mount", "-o", f"remount,size={size}", str(disk)], check=True)


@pytest.fixture
def read_only(tmp_path):
    """An empty folder on a read-only tmpfs (root writes through chmod 0o555, not this)."""
    with _mounted(tmp_path / "read-only", "ro,size=1m") as path:
        yield path


# --- a full disk and a read-only folder ----------------------------------------------------


def _finetune(files, out):
    return _command(
        "finetune",
        "--run",
        files["run"],
        "--data",
        files["train"],
        "--validation",
        files["validation"],
        "--learning-rates",
        "1e-3,3e-3",
        "--seeds",
        2,
        "--epochs",
        1,
        "--max-length",
        16,
        "--no-widen",
        "--out",
        out,
    )


def _without_timings(result: dict) -> dict:
    return {
        **result,
        "trials": [{k: v for k, v in t.items() if k != "seconds"} for t in result["trials"]],
        "kept": {k: v for k, v in result["kept"].items() if k != "seconds"},
    }


@pytest.fixture(scope="module")
def finetuned(files):
    """The uninterrupted fine-tune: its result.json and classifier weights."""
    out = files["root"] / "finetuned"
    done = _run(_finetune(files, out))
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_a_full_disk_during_finetune_keeps_the_finished_trials_and_a_rerun_completes(
    files, finetuned, small_disk
):
    # Room for one trial's weights, not for the second's beside it (written under a
    # temporary name, then renamed over the first).
    disk = small_disk(f"{TRIAL_WEIGHTS_BYTES * 3 // 2 // 1024}k")
    out = disk / "ft"
    full = _run(_finetune(files, out))
    assert full.returncode == 2, full.stderr[-3000:]
    line = _one_line(full.stderr)
    assert line.startswith(
        f"error: could not write the trial's weights at {out}/trials: No space left on device ("
    )
    assert line.endswith(
        " MiB free there); the trials that finished before are kept; free some "
        "space and run the same command again to resume from them"
    )
    assert not (out / "result.json").exists()
    assert len((out / "trials.jsonl").read_text().splitlines()) == 1
    assert not [name for name in os.listdir(out / "trials") if name.startswith(".tmp-")]

    _grow(disk, "20m")
    resumed = _run(_finetune(files, out))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "1 finished pretrained trial(s) kept from an earlier run" in resumed.stderr
    assert _without_timings(json.loads((out / "result.json").read_text())) == _without_timings(
        json.loads((finetuned / "result.json").read_text())
    )
    assert (out / "classifier.weights.h5").read_bytes() == (
        finetuned / "classifier.weights.h5"
    ).read_bytes()


@pytest.mark.slow
def test_a_full_disk_while_finetune_saves_its_classifier_leaves_no_result(
    files, finetuned, small_disk
):
    # Room for every trial's weights, not for the classifier after them.
    disk = small_disk("400k")
    out = disk / "ft"
    full = _run(_finetune(files, out))
    assert full.returncode == 2, full.stderr[-3000:]
    line = _one_line(full.stderr)
    assert line.startswith(f"error: could not write the fine-tuned classifier at {out}: ")
    assert line.endswith(
        f"; the finished trials are kept in {out}; free some space and run the "
        "same command again to resume from them"
    )
    assert not (out / "result.json").exists()
    assert len((out / "trials.jsonl").read_text().splitlines()) == 4
    _grow(disk, "20m")
    resumed = _run(_finetune(files, out))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "4 finished pretrained trial(s) kept from an earlier run" in resumed.stderr
    assert _without_timings(json.loads((out / "result.json").read_text())) == _without_timings(
        json.loads((finetuned / "result.json").read_text())
    )


def _predict(files, out):
    # Logits at every position: 70 x 32 x 512 float32, 4.6 MB.
    return _command(
        "predict",
        "--run",
        files["run"],
        "--data",
        files["records"],
        "--output",
        "logits",
        "--positions",
        "all",
        "--no-progress",
        "--out",
        out,
    )


def test_a_full_disk_during_predict_leaves_no_file_and_a_rerun_writes_it_whole(
    files, tmp_path, small_disk
):
    whole = tmp_path / "whole.npz"
    done = _run(_predict(files, whole))
    assert done.returncode == 0, done.stderr[-3000:]
    disk = small_disk("1m")
    out = disk / "p.npz"
    full = _run(_predict(files, out))
    assert full.returncode == 2, full.stderr[-3000:]
    assert _one_line(full.stderr).startswith(
        f"error: could not write the predictions at {out}: No space left on device ("
    )
    assert os.listdir(disk) == []  # neither the file nor its raw parts
    _grow(disk, "20m")
    again = _run(_predict(files, out))
    assert again.returncode == 0, again.stderr[-3000:]
    with np.load(out) as written, np.load(whole) as expected:
        np.testing.assert_array_equal(written["logits"], expected["logits"])


@pytest.mark.parametrize("name", ["predict", "finetune", "export", "train"])
def test_a_read_only_output_folder_is_one_line_before_any_work(files, read_only, name):
    out = read_only / ("p.npz" if name == "predict" else "out")
    command = {
        "predict": lambda: _predict(files, out),
        "finetune": lambda: _finetune(files, out),
        "export": lambda: _command("export", "--run", files["run"], "--out", out),
        "train": lambda: _train(files, out),
    }[name]()
    done = _run(command)
    assert done.returncode == 2, done.stderr[-3000:]
    key = "run_dir" if name == "train" else "--out"
    assert _one_line(done.stderr) == (
        f"error: {key} {out}: {read_only} is on a read-only file system; choose another {key}"
    )


@pytest.mark.slow
@pytest.mark.parametrize("format", ["hf", "keras-hub"])
def test_a_full_disk_during_export_leaves_no_export(files, small_disk, format):
    disk = small_disk("100k")
    out = disk / "export"
    full = _run(_command("export", "--run", files["run"], "--format", format, "--out", out))
    assert full.returncode == 2, full.stderr[-3000:]
    assert _one_line(full.stderr).startswith(
        f"error: could not write the {format} export at {out}: No space left on device"
    )
    assert os.listdir(disk) == []


# --- signals and kills --------------------------------------------------------------------


@pytest.fixture(scope="module")
def many_records(files):
    """Enough records that predicting or evaluating them outlasts the signal's delivery."""
    from kroberta.data.synthetic import write_seed_format

    path = files["root"] / "many.tfrecord"
    write_seed_format(str(path), 20_000, TINY_LENGTH, TINY_VOCAB, seed=3)
    return path


def _jax_loaded(process) -> bool:
    """Whether the process mapped JAX's library: it is past its argument checks, in its work."""
    with contextlib.suppress(OSError), open(f"/proc/{process.pid}/maps") as f:
        return "jaxlib" in f.read()
    return False


def _started(command, ready):
    """Starts `command` in a session of its own; returns once `ready(process)` holds."""
    process = subprocess.Popen(
        command,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": REPO},
    )
    deadline = time.monotonic() + TIMEOUT
    while not ready(process):
        if process.poll() is not None:
            raise AssertionError(f"ended before the signal: {process.communicate()[1][-3000:]}")
        assert time.monotonic() < deadline, "never ready"
        time.sleep(0.02)
    return process


def _stopped(process, signum, group: bool):
    """Sends `signum` to the process (or its group); returns (exit code, stderr)."""
    try:
        assert process.poll() is None, "ended before the signal"
        if group:
            os.killpg(process.pid, signum)
        else:
            process.send_signal(signum)
        _, stderr = process.communicate(timeout=STOP_TIMEOUT)
        return process.returncode, stderr
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def _signal_case(name, files, many_records, out):
    """(command, ready, the interrupted line's tail) of command `name` on the tiny run."""
    if name == "predict":
        command = _command(
            "predict",
            "--run",
            files["run"],
            "--data",
            many_records,
            "--no-progress",
            "--out",
            out / "p.npz",
        )

        def looping(process):  # its raw files' folder is there: the prediction loop started
            return any(entry.startswith(".kroberta-predict-") for entry in os.listdir(out))

        return command, looping, "; nothing was written"
    if name == "finetune":
        command = _command(
            "finetune",
            "--run",
            files["run"],
            "--data",
            files["train"],
            "--validation",
            files["validation"],
            "--learning-rates",
            "3e-3,1e-3",
            "--seeds",
            8,
            "--epochs",
            2,
            "--max-length",
            16,
            "--out",
            out / "ft",
        )
        return (
            command,
            lambda p: (out / "ft" / "trials.jsonl").is_file(),
            "; the same command again resumes, running only the trials not yet finished in "
            f"{out / 'ft'}",
        )
    if name == "evaluate":
        return (
            _command("evaluate", "--model", files["run"], "--data", many_records),
            _jax_loaded,
            "",
        )
    return _command("export", "--run", files["run"], "--out", out / "export"), _jax_loaded, ""


STOPS = [
    (name, signum, group)
    for name in ("predict", "finetune", "evaluate", "export")
    for signum in ("SIGTERM", "SIGINT")
    for group in (False, True)
]
# One case per command in the default tier; the rest are slow.
DEFAULT_STOPS = {
    ("predict", "SIGTERM", False),
    ("finetune", "SIGINT", True),
    ("evaluate", "SIGINT", False),
    ("export", "SIGTERM", True),
}


@pytest.mark.parametrize(
    "name, signum, group",
    [
        pytest.param(
            *case,
            marks=() if case in DEFAULT_STOPS else pytest.mark.slow,
            id=f"{case[0]}-{case[1]}-{'group' if case[2] else 'process'}",
        )
        for case in STOPS
    ],
)
def test_sigterm_and_sigint_stop_each_command_with_its_line(
    files, many_records, tmp_path, name, signum, group
):
    command, ready, tail = _signal_case(name, files, many_records, tmp_path)
    code, stderr = _stopped(_started(command, ready), getattr(signal, signum), group)
    first = "stopped by SIGTERM" if signum == "SIGTERM" else "interrupted"
    assert (code, _one_line(stderr)) == (143 if signum == "SIGTERM" else 130, first + tail)
    # Nothing at the final names: the .npz, the export, a fine-tune's result.
    assert not (tmp_path / "p.npz").exists()
    assert not (tmp_path / "export").exists()
    assert not (tmp_path / "ft" / "result.json").exists()


@pytest.mark.parametrize("name", ["predict", pytest.param("export", marks=pytest.mark.slow)])
def test_a_kill_leaves_nothing_at_the_final_name_and_a_rerun_writes_it_whole(
    files, many_records, tmp_path, name
):
    command, ready, _ = _signal_case(name, files, many_records, tmp_path)
    process = _started(command, ready)
    process.kill()
    process.communicate(timeout=STOP_TIMEOUT)
    final = tmp_path / ("p.npz" if name == "predict" else "export")
    assert not final.exists()
    again = _run(command)
    assert again.returncode == 0, again.stderr[-3000:]
    if name == "predict":
        whole = _run(command[:-1] + [str(tmp_path / "whole.npz")])
        assert whole.returncode == 0, whole.stderr[-3000:]
        with np.load(final) as written, np.load(tmp_path / "whole.npz") as expected:
            assert written.files == expected.files
            for key in written.files:
                np.testing.assert_array_equal(written[key], expected[key])
    else:
        assert (final / "model.safetensors").is_file()


# --- train: a full disk at a checkpoint and at the final model -----------------------------


def _train(files, run_dir, steps=40, checkpoint_every=10):
    return _command(
        "train",
        "--config",
        "tiny",
        f"--data.train={files['records']}",
        f"--run_dir={run_dir}",
        f"--train.steps={steps}",
        f"--train.checkpoint_every={checkpoint_every}",
        "--train.eval_every=0",
        "--train.log_every=10",
    )


def _final_weights(run_dir):
    import kroberta

    return [np.asarray(w) for w in kroberta.load(str(run_dir)).get_weights()]


@pytest.fixture(scope="module")
def trained(files):
    """The final weights of the uninterrupted run of `steps`, trained once per length."""
    weights = {}

    def of(steps: int):
        if steps not in weights:
            run_dir = files["root"] / f"trained-{steps}"
            done = _run(_train(files, run_dir, steps, checkpoint_every=steps))
            assert done.returncode == 0, done.stderr[-3000:]
            weights[steps] = _final_weights(run_dir)
        return weights[steps]

    return of


# (tmpfs size, steps, checkpoint every, the line). A checkpoint of the tiny model takes
# 0.5 MiB and needs 1.1 MiB free to start (twice its variables: Orbax merges a second copy
# before it commits): room for one checkpoint, not a second beside it. The run's other
# files take about 0.5 MiB more (the disk of 1800k has 0.7 MiB free at the second
# checkpoint), so each side has 0.3-0.4 MiB to spare: tensorboard's and the metrics' rows,
# written while the first checkpoint is, grow with the machine's load. (The final model's
# own check, 0.5 MiB, cannot fail on a disk that held the checkpoint before it; a disk
# another program fills in between gives "could not write the final model at ...".)
TRAIN_DISKS = {
    "checkpoint": (
        "1800k",
        40,
        10,
        r"error: could not write the checkpoint at step (\d+) in "
        r"{run}/checkpoints: No space left on device: a checkpoint needs about [\d.]+ "
        r"MiB \([\d.]+ MiB free there\); the previous checkpoints are intact",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("what", list(TRAIN_DISKS))
def test_a_full_disk_during_train_keeps_the_checkpoints_and_a_rerun_resumes(
    files, trained, small_disk, what
):
    from kroberta.training.checkpoint import list_checkpoints

    size, steps, every, pattern = TRAIN_DISKS[what]
    run_dir = small_disk(size) / "run"
    full = _run(_train(files, run_dir, steps, every))
    assert full.returncode == 2, full.stderr[-3000:]
    line = _one_line(full.stderr)
    match = re.fullmatch(pattern.format(run=re.escape(str(run_dir))), line)
    assert match, line
    failed_at = int(match.group(1))
    # The checkpoints before the failure are kept.
    kept = [step for step, _ in list_checkpoints(str(run_dir))]
    assert kept and kept[-1] == failed_at - every
    assert not (run_dir / "model.weights.h5").exists()
    _grow(run_dir.parent, "20m")
    resumed = _run(_train(files, run_dir, steps, every))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from {run_dir}/checkpoints/step_{kept[-1]:08d}" in resumed.stderr
    for a, b in zip(_final_weights(run_dir), trained(steps)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_a_disk_filled_by_another_program_while_train_runs_is_one_line(files, trained, small_disk):
    disk = small_disk("2m")
    run_dir = disk / "run"
    command = _train(files, run_dir, steps=200, checkpoint_every=100)
    process = _started(command, lambda p: (run_dir / "metrics.jsonl").is_file())
    filler = disk / "filler"
    with open(filler, "wb") as f, contextlib.suppress(OSError):
        while True:  # until the disk is full
            f.write(bytes(2**16))
    _, stderr = process.communicate(timeout=TIMEOUT)
    assert process.returncode == 2, stderr[-3000:]
    line = _one_line(stderr)
    assert line.startswith(
        (
            f"error: could not write the TensorBoard events at {run_dir}/"
            "tensorboard: No space left on device (",
            f"error: could not write the metrics at {run_dir}/metrics.jsonl: No "
            "space left on device (",
        )
    ), line
    filler.unlink()
    _grow(disk, "20m")
    again = _run(command)
    assert again.returncode == 0, again.stderr[-3000:]
    for a, b in zip(_final_weights(run_dir), trained(200)):
        np.testing.assert_array_equal(a, b)


def test_ctrl_c_to_train_s_group_still_writes_a_checkpoint_at_the_current_step(files, tmp_path):
    """The commands' own SIGINT handler gives way to training's, which checkpoints first."""
    from kroberta.training.checkpoint import list_checkpoints

    run_dir = tmp_path / "run"
    command = _train(files, run_dir, steps=100_000, checkpoint_every=100_000)
    metrics = run_dir / "metrics.jsonl"
    # Its first row: training is in its step loop (the file itself is opened before).
    process = _started(command, lambda p: metrics.is_file() and metrics.stat().st_size > 0)
    code, stderr = _stopped(process, signal.SIGINT, group=True)
    assert (code, _one_line(stderr)) == (130, "interrupted")
    step = list_checkpoints(str(run_dir))[-1][0]
    assert f"interrupted at step {step}: checkpoint written" in stderr

"""A fine-tune a script started in the background (SIGINT inherited ignored, its own session)
still stops on SIGINT, keeping the trials that finished, and says the same command resumes."""

import os
import signal
import subprocess
import sys
import time

from kroberta.run_layout import TRIALS_FILE
from tests.conftest import REPO
from tests.downstream.tasks import marker_task

TIMEOUT = 600  # seconds: JAX's start and the first trial's compilation on a loaded machine


def _finished_trials(out) -> int:
    path = out / TRIALS_FILE
    return len(path.read_text().splitlines()) if path.is_file() else 0


def test_sigint_stops_a_fine_tune_that_inherited_it_ignored(downstream_model, tmp_path):
    from kroberta.training import final_model

    run = tmp_path / "run"
    final_model.save(downstream_model, str(run))
    train, validation = marker_task(tmp_path, train=384, validation=32)
    out = tmp_path / "out"
    # Sixteen trials of 24 steps: far more than finish between the first one and the signal.
    command = [
        sys.executable,
        "-m",
        "kroberta.finetune",
        "--run",
        str(run),
        "--data",
        train,
        "--validation",
        validation,
        "--learning-rates",
        "3e-3,1e-3",
        "--seeds",
        "8",
        "--epochs",
        "2",
        "--max-length",
        "16",
        "--out",
        str(out),
    ]
    # What `cmd &` in a non-interactive shell does: the child inherits SIGINT ignored (an
    # ignored signal stays ignored across exec), in a session of its own.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        process = subprocess.Popen(
            command,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            env={**os.environ, "PYTHONPATH": REPO},
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        deadline = time.monotonic() + TIMEOUT
        while _finished_trials(out) == 0:
            assert process.poll() is None, process.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no trial finished"
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=TIMEOUT)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, stderr[-3000:]
    assert stderr.strip().splitlines()[-1] == (
        f"interrupted; the same command again resumes, running only the trials not yet "
        f"finished in {out}"
    )
    assert 1 <= _finished_trials(out) < 16
    assert not (out / "result.json").exists()

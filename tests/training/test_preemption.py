"""Job-wide preemption: a SIGTERM to one process of a two-process job stops both at one step.

Two real processes on localhost (2 simulated devices each, gloo collectives), as in
tests/parallel/test_distributed.py. Only process 1 is signalled: JAX's coordination service
tells process 0, both agree on the step, checkpoint there together and exit 143.
Re-running the same two commands resumes and ends where one uninterrupted process
ends.
"""

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time

import keras
import pytest

from kroberta import train
from kroberta.training import checkpoint
from tests.conftest import REPO, tiny_config
from tests.parallel.test_distributed import _assert_close_runs, _finish, _free_port

STEPS = 200
# A loaded machine (this test is meant to pass next to other jobs) makes a pair of
# 200-step runs take minutes; a hung collective still shows its stacks before this.
SUBPROCESS_TIMEOUT = 1200
RUN = dict(steps=STEPS, warmup_steps=20, log_every=10, eval_every=0, checkpoint_every=100)


def _commands(tiny_data, run_dir, port):
    common = [
        "--config",
        "tiny",
        f"--data.train={tiny_data}/train-*.tfrecord",
        f"--run_dir={run_dir}",
        "--data.shuffle_buffer=1",
        *(f"--train.{k}={v}" for k, v in RUN.items()),
        f"--distributed.coordinator=localhost:{port}",
        "--distributed.num_processes=2",
        "--distributed.initialization_timeout=120",
    ]
    return [common + [f"--distributed.process_id={i}"] for i in range(2)]


def _start(devices, weights, args):
    """tests/parallel/distributed_worker.py, with this test's longer hang limit."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["KROBERTA_TEST_HANG_SECONDS"] = str(SUBPROCESS_TIMEOUT - 60)
    return subprocess.Popen(
        [sys.executable, "tests/parallel/distributed_worker.py", str(devices), str(weights), *args],
        cwd=REPO,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def _last_logged_step(run_dir) -> int:
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        return 0
    with open(path) as f:
        steps = [json.loads(line)["step"] for line in f if line.strip().endswith("}")]
    return steps[-1] if steps else 0


@pytest.mark.slow
def test_sigterm_to_one_process_stops_the_whole_job_at_one_step_and_resumes(tiny_data, tmp_path):
    run_dir = tmp_path / "pair"
    commands = _commands(tiny_data, run_dir, _free_port())
    processes = [_start(2, f"{run_dir}.process{i}.npz", c) for i, c in enumerate(commands)]
    deadline = time.time() + SUBPROCESS_TIMEOUT
    while _last_logged_step(run_dir) < 20:
        assert time.time() < deadline, "the pair did not reach step 20"
        assert all(p.poll() is None for p in processes), _finish(processes)
        time.sleep(0.1)
    processes[1].send_signal(signal.SIGTERM)  # process 0 gets no signal
    results = _finish(processes, timeout=SUBPROCESS_TIMEOUT)
    stopped = []
    for i, (rc, out) in enumerate(results):
        assert rc == 143, out[-4000:]
        found = re.findall(rf"process {i}: stopped by SIGTERM at step (\d+)", out)
        assert found, out[-4000:]
        stopped.append(int(found[0]))
    assert stopped[0] == stopped[1], "both processes stop at the same step"
    step = stopped[0]
    assert 20 <= step < STEPS
    assert checkpoint.list_checkpoints(str(run_dir))[-1][0] == step  # written by both, together
    assert not (run_dir / "model.weights.h5").exists()

    # The same two commands again: both resume from that step and finish the run.
    commands = _commands(tiny_data, run_dir, _free_port())
    results = _finish(
        [_start(2, f"{run_dir}.process{i}.npz", c) for i, c in enumerate(commands)],
        timeout=SUBPROCESS_TIMEOUT,
    )
    for rc, out in results:
        assert rc == 0, out[-4000:]
    assert "resuming from" in results[0][1] and f"(step {step})" in results[0][1]

    # ... and end where one uninterrupted process of 4 devices ends.
    reference = tmp_path / "single"
    config = tiny_config(tiny_data, reference, **RUN)
    train(
        dataclasses.replace(
            config, data=dataclasses.replace(config.data, validation=(), shuffle_buffer=1)
        )
    )
    keras.distribution.set_distribution(None)
    # (The row right after the stop averages a shorter interval: compare the full ones.)
    _assert_close_runs(
        run_dir, reference, steps=[s for s in range(10, STEPS + 1, 10) if s - 10 >= step]
    )

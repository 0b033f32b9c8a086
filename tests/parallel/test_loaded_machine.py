"""The 4-simulated-device tests next to two busy processes: no collective may abort.

Under load a device thread can reach an all-reduce's rendezvous long after the
others; XLA's default 40 s termination timeout then aborted whole runs
(kroberta.runtime.xla_cpu sets it to an hour). This runs the tests whose steps hold
all-reduce, all-gather and reduce-scatter collectives over 4 simulated devices
(DataParallel, fsdp and tensor-parallel training on a 2 x 2 mesh, with their
evaluations and checkpoints) in a fresh pytest process, next to two processes that
spin on the CPU for the whole time.
"""

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

HOG = "while True: pass"
FOUR_DEVICE_TESTS = [
    "tests/parallel/test_distributed.py",
    "-k",
    "sharded_layouts or model_parallel_matches or fsdp_resumes",
]


@pytest.mark.slow
def test_four_device_tests_pass_next_to_two_cpu_hogs():
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(2)]
    try:
        env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # conftest sets them
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-x",
                "-p",
                "no:cacheprovider",
                *FOUR_DEVICE_TESTS,
            ],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=3600,
        )
        assert all(h.poll() is None for h in hogs), "the load ran for the whole time"
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert "4 passed" in result.stdout, result.stdout[-2000:]

"""End to end on gs:// against a local Cloud Storage emulator (gcp-storage-emulator, with
gcsfs: `pip install "kroberta[gcs]" gcp-storage-emulator`): prepare into a bucket,
train there, kill -9 mid-run, resume from the bucket's checkpoint, report and predict.

What goes through fsspec (gcsfs honours STORAGE_EMULATOR_HOST) is tested here. The
training data are read by tf.data, through TensorFlow's own GCS filesystem, which has
no endpoint setting and cannot reach an emulator: the run reads a local copy of the
prepared directory (the URL code path of `data.dir` is tested on TensorFlow's ram://
filesystem in tests/data/test_manifest_urls.py).
"""

import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import kroberta.cli.predict
import kroberta.cli.report
from kroberta import storage
from kroberta.training import checkpoint
from tests.conftest import REPO

pytestmark = pytest.mark.skipif(
    not (importlib.util.find_spec("gcp_storage_emulator") and importlib.util.find_spec("gcsfs")),
    reason='needs gcsfs and gcp-storage-emulator: pip install "kroberta[gcs]" gcp-storage-emulator',
)

BUCKET = "kroberta-test"

# The emulator, with its reading of single-request ("multipart") uploads fixed: it parses
# them with Python's email parser, which takes an object's final b"\r" for part of the
# line ending before the closing boundary (gcsfs frames parts with b"\n"), so an object
# ending in b"\r" lost that byte. The part is cut at the boundary here instead.
EMULATOR = """
import json, sys
from gcp_storage_emulator import server
from gcp_storage_emulator.__main__ import main

original = server._read_data

def read_data(handler, query):
    kind = handler.headers.get("Content-Type") or ""
    if not kind.startswith("multipart/related"):
        return original(handler, query)
    raw = server._decode_raw_data(server._read_raw_data(handler), handler)
    boundary = kind.split("boundary=", 1)[1].split(";")[0].strip().strip('"').encode()
    meta, content = raw.split(b"--" + boundary)[1:3]
    lf, crlf = content.find(b"\\n\\n"), content.find(b"\\r\\n\\r\\n")
    newline = b"\\r\\n" if crlf != -1 and (lf == -1 or crlf < lf) else b"\\n"
    head, body = content.split(newline * 2, 1)
    kind = next((line.split(b":", 1)[1].strip().decode() for line in head.split(newline)
                 if line.lower().startswith(b"content-type:")), "application/octet-stream")
    return {"meta": json.loads(meta.split(newline * 2, 1)[1]),
            "content": body[:-len(newline)], "content-type": kind}

server._read_data = read_data
sys.exit(main(sys.argv[1:]))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def emulator(monkeypatch):
    """A Cloud Storage emulator on a free port, in memory, with one bucket."""
    port = _free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-c",
            EMULATOR,
            "start",
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
            "--default-bucket",
            BUCKET,
            "--in-memory",
            "--quiet",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.time() > deadline or server.poll() is not None:
                server.kill()
                pytest.fail("the storage emulator did not start")
            time.sleep(0.1)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
    # gcsfs's default file system first asks Cloud Storage's gRPC control plane for the
    # bucket's layout, which the emulator lacks (a 60 s timeout per bucket).
    monkeypatch.setenv("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    yield f"gs://{BUCKET}"
    server.kill()
    server.wait()


def _rows(run_dir):
    path = storage.join(run_dir, "metrics.jsonl")
    if not storage.isfile(path):
        return []
    return [
        json.loads(line)
        for line in storage.read_text(path).splitlines()
        if line.strip().endswith("}")
    ]


@pytest.mark.slow  # about two minutes: two training processes and a prediction
def test_prepare_train_kill_resume_report_and_predict_on_a_bucket(emulator, tmp_path):
    from kroberta import prepare

    timings = {}
    started = time.perf_counter()
    words = ["alpha", "beta", "gamma", "delta", "tree", "river", "stone", "cloud", "light"]
    rng = np.random.default_rng(0)
    text = "".join(
        "The " + " ".join(rng.choice(words, rng.integers(5, 15))) + " ends here.\n\n"
        for _ in range(600)
    )
    (tmp_path / "corpus.txt").write_text(text)
    data_url = storage.join(emulator, "data")
    manifest = prepare(
        [str(tmp_path / "corpus.txt")],
        data_url,
        vocab_size=300,
        seq_len=32,
        validation_fraction=0.05,
        progress=False,
    )
    assert storage.isfile(storage.join(data_url, "manifest.json"))
    assert storage.isfile(storage.join(data_url, manifest["train"]["files"][0]))
    # tf.data cannot reach the emulator (module docstring): train on a local copy.
    local_data = tmp_path / "data"
    storage.get_tree(data_url, str(local_data))
    timings["prepare"] = time.perf_counter() - started

    run_dir = storage.join(emulator, "run")
    command = [
        sys.executable,
        "-m",
        "kroberta.train",
        "--config",
        "tiny",
        f"--data.dir={local_data}",
        f"--run_dir={run_dir}",
        "--model.vocabulary_size=300",
        "--train.steps=100000",
        "--train.checkpoint_every=20",
        "--train.log_every=10",
        "--train.eval_every=0",
    ]
    process = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=os.environ.copy()
    )
    deadline = time.time() + 300
    while not checkpoint.list_checkpoints(run_dir):
        if process.poll() is not None:
            raise AssertionError(f"training ended: {process.stderr.read().decode()[-2000:]}")
        assert time.time() < deadline, "no checkpoint reached the bucket in time"
        time.sleep(0.2)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    timings["train until killed"] = time.perf_counter() - started - timings["prepare"]
    saved = checkpoint.list_checkpoints(run_dir)
    last = saved[-1][0]
    logged = [r["step"] for r in _rows(run_dir) if r["split"] == "train"]
    assert logged and logged[-1] >= last

    resumed_at = time.perf_counter()
    stop = last + 20
    out = subprocess.run(
        command + [f"--until-step={stop}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env=os.environ.copy(),
    )
    assert out.returncode == 0, out.stderr[-2000:]
    match = re.search(r"resuming from (\S+) \(step (\d+)\)", out.stderr)
    assert match and int(match.group(2)) >= last, out.stderr[-2000:]
    start = int(match.group(2))
    # Rows logged after the checkpoint by the killed process were dropped, then logged again.
    steps = [r["step"] for r in _rows(run_dir) if r["split"] == "train"]
    assert steps == sorted(set(steps)) and steps[-1] == stop
    assert stop in dict(checkpoint.list_checkpoints(run_dir))
    assert storage.isfile(storage.join(run_dir, "tokenizer.json"))
    # Stopped at --until-step: the run is not over, so no final model; load reads the checkpoint.
    assert not storage.isfile(storage.join(run_dir, "model.weights.h5"))
    timings["resume"] = time.perf_counter() - resumed_at

    after = time.perf_counter()
    assert kroberta.cli.report.main([run_dir]) == 0
    assert storage.read_bytes(storage.join(run_dir, "report.png")).startswith(b"\x89PNG")
    predictions = storage.join(emulator, "predictions.npz")
    validation = manifest["validation"]["files"][0]
    assert (
        kroberta.cli.predict.main(
            [
                "--run",
                run_dir,
                "--data",
                str(local_data / validation),
                "--out",
                predictions,
                "--positions",
                "all",
                "--no-progress",
            ]
        )
        == 0
    )
    with storage.local_copy(predictions) as local, np.load(local) as arrays:
        assert len(arrays["token_ids"]) == manifest["validation"]["sequences"]
    timings["report and predict"] = time.perf_counter() - after
    print(
        "timings (s): "
        + ", ".join(f"{k} {v:.1f}" for k, v in timings.items())
        + f"; resumed from step {start}"
    )

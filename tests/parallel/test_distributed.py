"""Multi-process training (real processes on localhost, gloo CPU collectives) and the
sharded "fsdp"/"model" layouts on 4 simulated devices.

Why the pair equals one process: each process reads every 2nd file of each epoch's
shuffled file list (record-level sharding when there are fewer files than processes)
and numbers its elements i*2+p, the index they have in the single-process stream, so
their masks agree. With `data.shuffle_buffer = 1` and files of equal length the two
processes' batch k together hold exactly the records of single-process batch k (in
another row order: the loss is the same up to float summation order). A larger
shuffle buffer shuffles within each process: same distribution, other batches.
"""

import dataclasses
import json
import os
import re
import shutil
import socket
import subprocess
import sys

import h5py
import keras
import numpy as np
import pytest

from kroberta import train
from kroberta.config import DataConfig, validate
from kroberta.data import pipeline
from kroberta.errors import ConfigError
from kroberta.parallel import distribute
from tests.conftest import REPO, TINY_VOCAB, tiny_config

# Losses of the pair / the sharded layouts vs one DataParallel process. Measured:
# pair 5e-7, "model" 5e-7, "fsdp" 0 (float summation order only; 8 steps).
LOSS_TOLERANCE = 1e-4
WEIGHT_TOLERANCE = 1e-5
SUBPROCESS_TIMEOUT = 420
RUN = dict(steps=8, warmup_steps=2, log_every=2, eval_every=4, checkpoint_every=4)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _config(tiny_data, run_dir, **distributed):
    config = tiny_config(tiny_data, run_dir, **RUN)
    config = dataclasses.replace(config, data=dataclasses.replace(config.data, shuffle_buffer=1))
    return dataclasses.replace(
        config, distributed=dataclasses.replace(config.distributed, **distributed)
    )


def _args(tiny_data, run_dir, *extra):
    return [
        "--config",
        "tiny",
        f"--data.train={tiny_data}/train-*.tfrecord",
        f"--data.validation={tiny_data}/validation.tfrecord",
        f"--run_dir={run_dir}",
        "--data.shuffle_buffer=1",
        *(f"--train.{k}={v}" for k, v in RUN.items()),
        *extra,
    ]


def _start(devices, weights, args, **env):
    child_env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    child_env.update(KROBERTA_TEST_HANG_SECONDS=str(SUBPROCESS_TIMEOUT - 30), **env)
    return subprocess.Popen(
        [sys.executable, "tests/parallel/distributed_worker.py", str(devices), str(weights), *args],
        cwd=REPO,
        env=child_env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def _finish(processes, timeout=SUBPROCESS_TIMEOUT):
    outputs = []
    try:
        for p in processes:
            outputs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return [(p.returncode, out) for p, out in zip(processes, outputs)]


def _pair(tiny_data, run_dir, *extra, timeout_s=60, via_env=False):
    """Trains with two processes of 2 devices each; returns their weight files.

    The job is described by --distributed.* flags, or (`via_env`) by the variables
    `keras.distribution.initialize` reads.
    """
    port = _free_port()
    # Beside the run directory (a file:// URL's local path).
    weights = [f"{str(run_dir).removeprefix('file://')}.process{i}.npz" for i in range(2)]
    common = _args(tiny_data, run_dir, f"--distributed.initialization_timeout={timeout_s}", *extra)
    processes = []
    for i in range(2):
        if via_env:
            env = {
                "KERAS_DISTRIBUTION_JOB_ADDRESSES": f"localhost:{port}",
                "KERAS_DISTRIBUTION_NUM_PROCESSES": "2",
                "KERAS_DISTRIBUTION_PROCESS_ID": str(i),
            }
            processes.append(_start(2, weights[i], common, **env))
        else:
            flags = [
                f"--distributed.coordinator=localhost:{port}",
                "--distributed.num_processes=2",
                f"--distributed.process_id={i}",
            ]
            processes.append(_start(2, weights[i], common + flags))
    results = _finish(processes)
    for rc, out in results:
        assert rc == 0, out[-4000:]
    return weights, results


def _rows(run_dir, split="train"):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return {r["step"]: r["loss"] for r in map(json.loads, f) if r["split"] == split}


def _h5(run_dir):
    out = {}
    with h5py.File(os.path.join(run_dir, "model.weights.h5")) as f:
        f.visititems(
            lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None
        )
    return out


def _assert_close_runs(run_dir, reference_dir, steps=None):
    for split in ("train", "validation"):
        got, want = _rows(run_dir, split), _rows(reference_dir, split)
        for step in [s for s in want if steps is None or s in steps]:
            assert got[step] == pytest.approx(want[step], abs=LOSS_TOLERANCE), (split, step)
    a, b = _h5(run_dir), _h5(reference_dir)
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_allclose(a[key], b[key], atol=WEIGHT_TOLERANCE, err_msg=key)


def _copy_checkpoint(source_run, step, target_run):
    """A run dir holding only `source_run`'s checkpoint at `step` (to resume from)."""
    name = f"step_{step:08d}"
    os.makedirs(os.path.join(target_run, "checkpoints"))
    shutil.copytree(
        os.path.join(source_run, "checkpoints", name), os.path.join(target_run, "checkpoints", name)
    )
    shutil.copy(os.path.join(source_run, "config.toml"), target_run)


@pytest.fixture(autouse=True)
def _no_leftover_distribution():
    yield
    keras.distribution.set_distribution(None)


@pytest.fixture(scope="module")
def single_run(tiny_data, tmp_path_factory):
    """The reference: one process, 4 devices, DataParallel, 8 steps (checkpoints at 4, 8)."""
    run_dir = tmp_path_factory.mktemp("single")
    train(_config(tiny_data, run_dir))
    keras.distribution.set_distribution(None)
    return run_dir


# ---- the data each process reads --------------------------------------------------


def _batches(spec, data, batch, shard, count=3, device_masks=False):
    ds = pipeline.train_dataset(
        spec, data, TINY_VOCAB, batch, seed=5, shard=shard, device_masks=device_masks
    )
    if device_masks:  # unmasked ids and the keys the step draws the masks from
        return [
            (x["token_ids"], x["padding_mask"], x["mask_keys"][:, None].astype(np.int64))
            for x in ds.take(count).as_numpy_iterator()
        ]
    return [(x["token_ids"], x["mask_positions"], y) for x, y in ds.take(count).as_numpy_iterator()]


@pytest.mark.parametrize("device_masks", [False, True], ids=["host-masks", "step-masks"])
@pytest.mark.parametrize("files", [2, 1], ids=["file-sharding", "record-sharding"])
def test_process_shards_compose_the_single_process_batches(tiny_data, files, device_masks):
    pattern = "train-*.tfrecord" if files == 2 else "train-0.tfrecord"
    spec = pipeline.inspect_files(pipeline.resolve_files([str(tiny_data / pattern)], "t"), "t")
    data = dataclasses.replace(DataConfig(), shuffle_buffer=1)
    single = _batches(spec, data, 8, None, device_masks=device_masks)
    shards = [_batches(spec, data, 4, (2, p), device_masks=device_masks) for p in range(2)]
    for k, whole in enumerate(single):
        parts = [np.concatenate([shards[p][k][i] for p in range(2)]) for i in range(3)]
        # Same rows, masks and labels; only their order within the batch differs.
        key = lambda arrays: sorted(map(tuple, np.concatenate(arrays, axis=1).tolist()))
        assert key(whole) == key(parts)
        assert not np.array_equal(shards[0][k][0], shards[1][k][0])  # the processes differ


def test_eval_shards_compose_the_single_process_batches(tiny_data):
    spec = pipeline.inspect_files([str(tiny_data / "validation.tfrecord")], "v")
    data = DataConfig()
    whole = list(pipeline.eval_dataset(spec, data, TINY_VOCAB, 16, 0).as_numpy_iterator())
    parts = [
        list(pipeline.eval_dataset(spec, data, TINY_VOCAB, 16, 0, shard=(2, p)).as_numpy_iterator())
        for p in range(2)
    ]
    assert len(whole) == len(parts[0]) == len(parts[1]) == 5  # ceil(70 / 16)
    for k, (x, y) in enumerate(whole):
        np.testing.assert_array_equal(
            x["token_ids"], np.concatenate([parts[p][k][0]["token_ids"] for p in range(2)])
        )
        np.testing.assert_array_equal(y, np.concatenate([parts[p][k][1] for p in range(2)]))


# ---- two processes ----------------------------------------------------------------


@pytest.mark.slow
def test_two_processes_train_like_one_and_hand_checkpoints_over(tiny_data, tmp_path, single_run):
    # The pair: 2 processes x 2 devices, the same global batch of 16 as one x 4.
    pair_dir = tmp_path / "pair"
    weights, results = _pair(tiny_data, pair_dir)
    first, second = (np.load(w) for w in weights)
    assert len(first.files) > 30
    for key in first.files:  # each process's own copy of the replicated weights
        np.testing.assert_array_equal(first[key], second[key])
    assert "4 cpu device(s) (cpu) in 2 process(es)" in results[0][1]
    assert "step 8/8 [train]" in results[0][1] and "[train]" not in results[1][1]  # 0 logs
    assert sorted(os.listdir(pair_dir / "checkpoints")) == ["step_00000004", "step_00000008"]
    _assert_close_runs(pair_dir, single_run)

    # The pair's step-4 checkpoint, resumed by one process, ends where the single run did.
    resumed = tmp_path / "pair_to_single"
    _copy_checkpoint(pair_dir, 4, resumed)
    summary = train(_config(tiny_data, resumed))
    assert summary["start_step"] == 4 and summary["final_step"] == 8
    _assert_close_runs(resumed, single_run, steps=[6, 8])


@pytest.mark.slow
@pytest.mark.stack  # the stack job runs it (it selects by marker, slow or not)
def test_two_processes_fusing_two_steps_per_dispatch_train_like_one(
    tiny_data, tmp_path, single_run
):
    # K = 2 steps in one program per dispatch on each process (the reference runs K = 1):
    # the super-batches are assembled across the processes and must give the same run.
    pair_dir = tmp_path / "pair_k2"
    weights, results = _pair(tiny_data, pair_dir, "--train.steps_per_execution=2")
    first, second = (np.load(w) for w in weights)
    for key in first.files:
        np.testing.assert_array_equal(first[key], second[key])
    assert "steps_per_execution = 2" in (pair_dir / "config.toml").read_text()
    # The reference's "auto" is K = 1 here: it is at most half of log_every = 2.
    assert 'steps_per_execution = "auto"' in (single_run / "config.toml").read_text()
    assert "step 8/8 [train]" in results[0][1]
    _assert_close_runs(pair_dir, single_run)


@pytest.mark.slow
def test_two_processes_checkpoint_to_a_url_and_resume_from_it(tiny_data, tmp_path, single_run):
    """A run directory on a URL (file://: the object-storage paths, no shared directory for
    Orbax's per-process writes) in a job of two processes: the state is gathered, process 0
    uploads each checkpoint marker last, and a second job resumes from the URL and ends where
    the single process did."""
    local = tmp_path / "pair_url"
    url = f"file://{local}"
    _, first = _pair(tiny_data, url, "--until-step=4")
    assert "step 4/8 [checkpoint]" in first[0][1]
    assert sorted(os.listdir(local / "checkpoints")) == ["step_00000004"]
    assert os.path.isfile(local / "checkpoints" / "step_00000004" / "_CHECKPOINT_METADATA")
    weights, second = _pair(tiny_data, url)
    assert "resuming from" in second[0][1] and "(step 4)" in second[0][1]
    a, b = (np.load(w) for w in weights)
    for key in a.files:
        np.testing.assert_array_equal(a[key], b[key])
    assert sorted(os.listdir(local / "checkpoints")) == ["step_00000004", "step_00000008"]
    _assert_close_runs(local, single_run)


@pytest.mark.slow
def test_one_process_checkpoint_resumes_in_two(tiny_data, tmp_path, single_run):
    resumed = tmp_path / "single_to_pair"
    _copy_checkpoint(single_run, 4, resumed)
    _, results = _pair(tiny_data, resumed, via_env=True)
    assert "in 2 process(es)" in results[0][1]
    assert "resuming from" in results[0][1] and "(step 4)" in results[0][1]
    _assert_close_runs(resumed, single_run, steps=[6, 8])


# ---- sharded layouts on one process, 4 devices as a 2 x 2 mesh --------------------


@pytest.mark.parametrize("strategy", ["fsdp", "model"])
def test_sharded_layouts_split_the_weights(tiny_data, tmp_path, strategy):
    from kroberta.model.mlm import build_compiled_model
    from kroberta.perf.plan import for_local_devices

    config = _config(tiny_data, tmp_path, strategy=strategy, model_parallel=2)
    topology = distribute.setup(config.distributed, config.model)
    assert topology.mesh_shape == {"batch": 2, "model": 2}
    model = build_compiled_model(for_local_devices(config))
    by_path = {v.path: v.value for v in model.variables}
    table = by_path["embeddings/token_embedding/embeddings"]  # (512, 32)
    assert table.sharding.shard_shape(table.shape) == (512, 16)
    query = by_path["transformer_layer_0/self_attention_layer/query/kernel"]  # (32, 2, 16)
    expected = (32, 1, 16) if strategy == "model" else (16, 2, 16)
    assert query.sharding.shard_shape(query.shape) == expected
    ffn = by_path["transformer_layer_1/feedforward_intermediate_dense/kernel"]  # (32, 64)
    assert ffn.sharding.shard_shape(ffn.shape) == (32, 32)
    norm = by_path["embeddings_layer_norm/gamma"]
    assert norm.sharding.is_fully_replicated
    # The AdamW moments follow their weights.
    moments = [v.value for v in model.optimizer.variables if "token_embedding" in v.path]
    assert moments and all(m.sharding.shard_shape(m.shape) == (512, 16) for m in moments)
    per_device = distribute.bytes_per_device(model.trainable_variables)
    total = sum(v.value.nbytes for v in model.trainable_variables)
    assert per_device < 0.7 * total


def test_model_parallel_matches_data_parallel(tiny_data, tmp_path, single_run, caplog):
    run_dir = tmp_path / "model"
    with caplog.at_level("INFO", logger="kroberta"):
        train(_config(tiny_data, run_dir, strategy="model", model_parallel=2))
    out = "\n".join(caplog.messages)
    assert "mesh batch=2 x model=2; ModelParallel (tensor)" in out
    assert "MiB per device (sharded over model=2)" in out
    _assert_close_runs(run_dir, single_run)


def test_fsdp_resumes_a_data_parallel_checkpoint(tiny_data, tmp_path, single_run):
    run_dir = tmp_path / "fsdp"
    _copy_checkpoint(single_run, 4, run_dir)
    summary = train(_config(tiny_data, run_dir, strategy="fsdp", model_parallel=2))
    assert summary["start_step"] == 4
    _assert_close_runs(run_dir, single_run, steps=[6, 8])


# ---- misconfigurations: a clear error, never a hang -------------------------------


def test_model_axis_must_divide_heads_devices_and_the_batch(tiny_data, tmp_path):
    config = _config(tiny_data, tmp_path, strategy="model", model_parallel=3)
    with pytest.raises(
        ConfigError,
        match=r"distributed.model_parallel: a model axis of 3 does "
        r"not divide model.num_heads=2",
    ):
        validate(config)
    config = _config(tiny_data, tmp_path, strategy="fsdp", model_parallel=2, devices=3)
    with pytest.raises(
        ConfigError,
        match=r"model axis of 2 does not divide the 3 devices, so the "
        r"batch axis would not be whole",
    ):
        distribute.setup(config.distributed, config.model)
    config = _config(tiny_data, tmp_path, strategy="model")  # 0 = the 4 local devices
    with pytest.raises(
        ConfigError,
        match=r"distributed.model_parallel \(0 = the 4 devices per "
        r"process\): a model axis of 4 does not divide "
        r"model.num_heads=2",
    ):
        distribute.setup(config.distributed, config.model)


def test_coordinator_needs_the_process_count_and_id(tiny_data, tmp_path):
    config = _config(tiny_data, tmp_path, coordinator="localhost:1234")
    with pytest.raises(
        ConfigError,
        match="distributed.num_processes: needed with distributed.coordinator='localhost:1234'",
    ):
        train(config)
    config = _config(tiny_data, tmp_path, num_processes=2, process_id=1)
    with pytest.raises(ConfigError, match=r"distributed.coordinator: needed \(HOST:PORT"):
        train(config)


def test_unreachable_coordinator_and_mismatched_processes_fail_fast(tiny_data, tmp_path):
    def cli(port, num, pid):
        return [
            sys.executable,
            "-m",
            "kroberta.train",
            *_args(tiny_data, tmp_path / f"r{pid}"),
            f"--distributed.coordinator=localhost:{port}",
            f"--distributed.num_processes={num}",
            f"--distributed.process_id={pid}",
            "--distributed.initialization_timeout=4",
        ]

    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    mismatch = _free_port()
    commands = [
        cli(_free_port(), 2, 1),  # nobody listens there
        cli(_free_port(), 2, 0),  # process 1 never comes
        cli(mismatch, 2, 0),
        cli(mismatch, 3, 1),
    ]  # 2 vs 3 processes
    results = _finish(
        [
            subprocess.Popen(
                c, cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
            for c in commands
        ],
        timeout=180,
    )
    expected = [
        r"error: distributed.coordinator: nothing answered at localhost:\d+ within 4 s",
        r"error: distributed.initialization_timeout: only 1 of 2 processes reached the "
        r"coordinator localhost:\d+ within 4 s \(missing process_id\(s\): 1\)",
        r"error: distributed.num_processes: process 1 was started with num_processes=3, "
        r"process 0 with 2",
        r"error: distributed.num_processes: process 1 was started with num_processes=3, "
        r"process 0 with 2",
    ]
    for (rc, out), pattern in zip(results, expected):
        assert rc == 2, out[-3000:]
        assert re.search(pattern, out), out[-3000:]
        assert "Traceback" not in out

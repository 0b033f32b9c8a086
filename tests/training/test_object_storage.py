"""A run directory on a URL (fsspec's in-process memory://): train, checkpoint, resume,
load, report, predict --out; and what a half-uploaded checkpoint leaves behind."""

import json
import os
import uuid

import numpy as np
import pytest

import kroberta
import kroberta.cli.predict
from kroberta import storage
from kroberta.training import checkpoint
from tests.conftest import tiny_config


@pytest.fixture
def url():
    return f"memory://kroberta-test-{uuid.uuid4().hex[:8]}/run"


def _rows(run_dir, split="train"):
    rows = [
        json.loads(line)
        for line in storage.read_text(storage.join(run_dir, "metrics.jsonl")).splitlines()
    ]
    return [r for r in rows if r["split"] == split]


def test_a_run_on_a_url_checkpoints_resumes_loads_and_reports(tiny_data, url, tmp_path):
    config = tiny_config(
        tiny_data,
        url,
        steps=20,
        log_every=5,
        eval_every=10,
        checkpoint_every=10,
        keep_checkpoints=1,
        keep_best=True,
        profile="10:15",
    )
    kroberta.train(config, until_step=10)
    assert [s for s, _ in checkpoint.list_checkpoints(url)] == [10]
    summary = kroberta.train(config)  # a new invocation: resumes from the URL's checkpoint
    assert summary["start_step"] == 10 and summary["final_step"] == 20
    # Every row once, in order, across the two invocations (rewritten whole per row).
    assert [r["step"] for r in _rows(url)] == [5, 10, 15, 20]
    names = storage.listdir(url)
    assert {
        "config.toml",
        "model.weights.h5",
        "metrics.jsonl",
        "checkpoints",
        "tensorboard",
    } <= set(names)
    assert storage.listdir(storage.join(url, "tensorboard"))
    assert storage.listdir(storage.join(url, "profile"))  # traced locally, then uploaded
    # keep_best keeps the best one beside the newest; the first upload was pruned whole.
    kept = [s for s, _ in checkpoint.list_checkpoints(url)]
    assert kept[-1] == 20 and set(kept) <= {10, 20}
    assert len(storage.listdir(storage.join(url, "checkpoints"))) == len(kept)

    final = kroberta.load(url)
    last = kroberta.load(url, checkpoint="last")
    for a, b in zip(final.get_weights(), last.get_weights()):
        np.testing.assert_array_equal(a, b)  # the final model is the step-20 checkpoint's
    # A checkpoint loads as the same model class: Hugging Face's input names work too.
    ids = np.full((2, 16), 5, "int32")
    np.testing.assert_array_equal(
        last.predict({"input_ids": ids}, verbose=0), final.predict(ids, verbose=0)
    )
    assert kroberta.load(url, checkpoint="best").kroberta_step in kept

    report = kroberta.report(url, show=False)
    assert report["report_png"] == storage.join(url, "report.png")
    assert storage.read_bytes(report["report_png"]).startswith(b"\x89PNG")

    out = storage.join(url, "predictions.npz")
    assert (
        kroberta.cli.predict.main(
            [
                "--run",
                url,
                "--data",
                str(tiny_data / "validation.tfrecord"),
                "--output",
                "top_k",
                "--k",
                "3",
                "--out",
                out,
                "--no-progress",
            ]
        )
        == 0
    )
    with storage.local_copy(out) as local, np.load(local) as arrays:
        assert arrays["token_ids"].shape == (70, 6, 3)


def test_a_checkpoint_whose_upload_was_cut_short_is_ignored_then_cleaned(url):
    complete = storage.join(url, "checkpoints", "step_00000010")
    cut = storage.join(url, "checkpoints", "step_00000020")
    storage.write_text(storage.join(complete, "state", "x"), "x")
    storage.write_text(storage.join(complete, checkpoint.COMMIT_FILE), "{}")
    storage.write_text(storage.join(cut, "state", "x"), "x")  # killed before the marker
    assert checkpoint.list_checkpoints(url) == [(10, complete)]
    checkpoint.clean_temporaries(url)
    assert storage.listdir(storage.join(url, "checkpoints")) == ["step_00000010"]


def test_synchronous_checkpoints_on_a_url_restore_exactly_and_prune_marker_first(
    tiny_data, url, tmp_path, monkeypatch
):
    import dataclasses

    from kroberta.model.mlm import build_compiled_model
    from kroberta.perf.plan import for_local_devices

    config = for_local_devices(tiny_config(tiny_data, tmp_path))
    model = build_compiled_model(config)
    writer = checkpoint.Writer(url, keep=2, asynchronous=False)
    for step in (1, 2):
        writer.save(model, step)
    writer.close()
    assert [s for s, _ in checkpoint.list_checkpoints(url)] == [1, 2]
    other = build_compiled_model(
        dataclasses.replace(config, train=dataclasses.replace(config.train, seed=7))
    )
    assert checkpoint.restore(other, storage.join(url, "checkpoints", "step_00000002"))["step"] == 2
    for a, b in zip(model.variables, other.variables):
        np.testing.assert_array_equal(np.asarray(a.value), np.asarray(b.value))
    # A removal cut short after its marker went leaves nothing that looks complete.
    monkeypatch.setattr(storage, "rmtree", lambda path: (_ for _ in ()).throw(OSError("cut")))
    with pytest.raises(OSError):
        checkpoint.remove(storage.join(url, "checkpoints", "step_00000001"))
    assert [s for s, _ in checkpoint.list_checkpoints(url)] == [2]


@pytest.mark.fast
def test_the_embedded_corpus_of_a_url_run_is_prepared_in_a_local_folder_of_its_own(tmp_path):
    import tempfile

    from kroberta.training.run_data import _local_home

    assert _local_home(str(tmp_path)) == str(tmp_path)  # a local run: in its directory
    home = _local_home("gs://bucket/run")
    assert os.path.dirname(home) == tempfile.gettempdir()
    assert home == _local_home("gs://bucket/run") != _local_home("gs://bucket/other")

"""`train.downstream`: a linear probe at every checkpoint, in metrics.jsonl and the trackers,
without changing what the run trains; a bad setting is a ConfigError naming the key."""

import dataclasses
import glob
import json
import math
import os

import pytest

import kroberta
from kroberta.config import config_path, load_config, load_toml
from kroberta.errors import ConfigError
from tests.conftest import prepare_word_corpus
from tests.downstream.tasks import WORDS, marker_task


def _config(data, run_dir, downstream):
    config = load_toml(config_path("tiny"))
    return dataclasses.replace(
        config,
        run_dir=str(run_dir),
        model=dataclasses.replace(config.model, vocabulary_size=300),
        data=dataclasses.replace(config.data, dir=str(data)),
        train=dataclasses.replace(
            config.train,
            steps=4,
            warmup_steps=1,
            log_every=2,
            eval_every=2,
            checkpoint_every=2,
            steps_per_execution=1,
            downstream=downstream,
        ),
    )


def _rows(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same tiny run (4 steps, checkpoints at 2 and 4) with the probe on a labelled
    JSON-lines task (stopped after step 2 and resumed) and without it."""
    root = tmp_path_factory.mktemp("downstream")
    data = prepare_word_corpus(root, WORDS, documents=200)
    train_file, validation_file = marker_task(root, train=64, validation=32)
    probed = _config(
        data, root / "probed", {"task": "marker", "data": train_file, "validation": validation_file}
    )
    kroberta.train(probed, until_step=2)
    kroberta.train(probed)
    kroberta.train(_config(data, root / "plain", {}))
    return _rows(probed.run_dir), _rows(root / "plain"), probed.run_dir


def test_each_checkpoint_has_a_row_of_finite_probe_scores(runs):
    probed, _, _ = runs
    rows = [r for r in probed if r["split"] == "downstream/marker"]
    assert [r["step"] for r in rows] == [2, 4]
    for row in rows:
        assert {"accuracy", "f1", "matthews", "seconds"} <= set(row)
        assert all(math.isfinite(row[key]) for key in ("accuracy", "f1", "matthews"))
        assert 0.0 <= row["accuracy"] <= 1.0 and row["seconds"] > 0


def test_each_probe_row_says_how_far_it_is_above_the_random_line_and_its_noise(runs):
    probed, _, _ = runs
    (reference,) = [r for r in probed if r["split"] == "downstream/marker/random_init"]
    rows = [r for r in probed if r["split"] == "downstream/marker"]
    # Step 4 was probed after a resume: the random initialisation predicted again, the same.
    for row in rows:
        assert row["vs_random_init"] == pytest.approx(row["accuracy"] - reference["accuracy"])
        assert row["vs_random_init_low"] <= row["vs_random_init"] <= row["vs_random_init_high"]
        assert row["vs_random_init_high"] - row["vs_random_init_low"] > 0  # 32 texts: noisy


def test_the_random_initialisations_probe_is_one_row_per_run_across_a_resume(runs):
    probed, _, _ = runs
    rows = [r for r in probed if r["split"] == "downstream/marker/random_init"]
    assert [r["step"] for r in rows] == [2]  # with the first probe, not again on resume
    assert {"accuracy", "f1", "matthews", "seconds"} <= set(rows[0])
    assert 0.0 <= rows[0]["accuracy"] <= 1.0
    # Written before the trained model's probe at the same step.
    splits = [r["split"] for r in probed if r["split"].startswith("downstream/")]
    assert splits == ["downstream/marker/random_init", "downstream/marker", "downstream/marker"]


def test_the_probe_changes_no_training_loss(runs):
    probed, plain, _ = runs

    def losses(rows, split):
        return [(r["step"], r["loss"]) for r in rows if r["split"] == split]

    assert len(losses(plain, "train")) == 2
    assert not any(r["split"].startswith("downstream") for r in plain)
    for split in ("train", "validation"):
        assert losses(probed, split) == losses(plain, split)  # bit for bit


def test_the_probe_scores_reach_tensorboard(runs):
    import tensorflow as tf

    probed, _, run_dir = runs
    logged = {}
    for path in glob.glob(os.path.join(run_dir, "tensorboard", "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                logged[(value.tag, event.step)] = float(tf.make_ndarray(value.tensor))
    for row in (r for r in probed if r["split"] == "downstream/marker"):
        assert logged[("downstream/marker/accuracy", row["step"])] == pytest.approx(row["accuracy"])


@pytest.mark.parametrize(
    "value, problem",
    [
        ("squad", 'expected "stdlib"'),
        ({"data": "train.jsonl"}, "data and validation"),
        ({"task": "stdlib", "labels": "y"}, "unknown key(s) labels"),
        ({"data": "a.jsonl", "validation": "b.jsonl", "kind": "ranking"}, "kind = 'ranking'"),
        (
            {"data": "a.jsonl", "validation": "b.jsonl", "text_fields": ["a", "b", "c"]},
            "a list of two",
        ),
        (3, "expected a table or a task's name"),
    ],
)
def test_a_bad_setting_is_a_config_error_naming_the_key(value, problem):
    with pytest.raises(ConfigError, match="train.downstream") as error:
        load_config(None, {"train.downstream": value})
    assert problem in str(error.value)


def test_the_setting_reads_as_a_word_or_a_table(tmp_path):
    assert load_config(None, {"train.downstream": "stdlib"}).train.downstream == {"task": "stdlib"}
    assert load_config(None).train.downstream == {}  # off
    path = tmp_path / "probe.toml"
    path.write_text(
        '[train.downstream]\ndata = "a.jsonl"\nvalidation = "b.jsonl"\n'
        'text_fields = ["premise", "hypothesis"]\n'
    )
    assert load_config(str(path)).train.downstream["text_fields"] == ["premise", "hypothesis"]


def _logger(model, run_dir, train_file, validation_file):
    from kroberta.pretraining import probe
    from kroberta.training.run_callbacks import RunLogger
    from kroberta.training.run_dir import resumed_history

    config = model.kroberta_config
    config = dataclasses.replace(
        config,
        run_dir=str(run_dir),
        train=dataclasses.replace(
            config.train,
            trackers=(),
            downstream={"data": train_file, "validation": validation_file},
        ),
    )
    logger = RunLogger(
        config,
        0,
        16,
        32,
        lambda: {"loss": 1.0},
        stop_step=10,
        save_checkpoints=False,
        probe=probe.for_run(config, 32),
        history=resumed_history(str(run_dir), 0, write=True),  # as train hands it over
    )
    logger.set_model(model)
    return logger


def test_a_run_that_evaluates_at_its_start_probes_there_once(downstream_model, tmp_path):
    from kroberta.training import final_model

    train_file, validation_file = marker_task(tmp_path, train=64, validation=32)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with pytest.raises(ConfigError, match="train.downstream: needs the run's tokenizer"):
        _logger(downstream_model, run_dir, train_file, validation_file)
    (run_dir / final_model.TOKENIZER_FILE).write_text(downstream_model.tokenizer.to_str())
    for _ in range(2):  # the second run (a restart at step 0) keeps the rows it finds
        logger = _logger(downstream_model, run_dir, train_file, validation_file)
        logger.evaluate_at_start()
        logger.close()
    rows = _rows(run_dir)
    assert [(r["step"], r["split"]) for r in rows] == [
        (0, "validation"),
        (0, "downstream/train/random_init"),
        (0, "downstream/train"),
    ]
    assert rows[2]["accuracy"] >= 0.9  # the marker task: even random embeddings hold the token

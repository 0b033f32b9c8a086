import dataclasses
import json
import math
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

import kroberta
from kroberta import train
from kroberta.errors import ConfigError
from kroberta.model.schedules import WarmupSchedule
from kroberta.pretraining.train import Outcome
from tests.conftest import REPO, TINY_VOCAB, tiny_config


def _rows(run_dir, split="train"):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["split"] == split]


def _weights(run_dir):
    out = {}
    with h5py.File(os.path.join(run_dir, "model.weights.h5")) as f:
        f.visititems(
            lambda name, obj: (
                out.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None
            )
        )
    return out


@pytest.fixture(scope="module")
def trained_run(tiny_data, tmp_path_factory):
    """The tiny config trained for 120 steps on 4 simulated devices."""
    run_dir = tmp_path_factory.mktemp("run")
    config = tiny_config(tiny_data, run_dir, steps=120, eval_every=60, checkpoint_every=60)
    summary = train(config)
    return run_dir, summary


def test_fit_on_four_devices_lowers_the_loss(trained_run):
    run_dir, summary = trained_run
    assert summary["devices"] == 4 and summary["global_batch"] == 16
    assert summary["final_step"] == 120
    rows = _rows(run_dir)
    assert rows[0]["loss"] > math.log(TINY_VOCAB) - 0.3  # starts near chance
    assert rows[-1]["loss"] < math.log(TINY_VOCAB) - 1.0  # well below it
    validation = _rows(run_dir, "validation")
    assert [r["step"] for r in validation] == [60, 120]
    assert validation[-1]["loss"] < validation[0]["loss"]


def test_metrics_jsonl_has_one_row_per_interval_with_the_documented_keys(trained_run):
    run_dir, _ = trained_run
    rows = _rows(run_dir)
    assert [r["step"] for r in rows] == list(range(10, 121, 10))
    for row in rows:
        assert {
            "step",
            "split",
            "loss",
            "masked_accuracy",
            "learning_rate",
            "samples_per_second",
            "perplexity",
            "tokens_per_second",
        } <= set(row)
        assert row["perplexity"] == pytest.approx(math.exp(row["loss"]), rel=0.05)
    assert rows[0]["compile_seconds"] > 0  # reported apart, not counted as step time
    assert rows[0]["step_time"] == pytest.approx(16 / rows[0]["samples_per_second"])
    assert rows[-1]["learning_rate"] == 0.0  # linear decay reaches zero at train.steps
    assert max(r["learning_rate"] for r in rows) == pytest.approx(3e-3)  # the peak, after warmup
    # Every row logs the schedule's value at its step (tiny: warmup 20 of 120, linear).
    schedule = WarmupSchedule(3e-3, 20, 120, "linear")
    for row in rows:
        assert row["learning_rate"] == pytest.approx(float(schedule(row["step"])), abs=1e-9)


def test_the_compilation_is_announced_before_the_first_log_line(tiny_data, tmp_path, caplog):
    config = tiny_config(
        tiny_data,
        tmp_path,
        steps=8,
        log_every=4,
        eval_every=8,
        checkpoint_every=8,
        warmup_steps=0,
        steps_per_execution=2,
    )
    train(config)
    lines = caplog.messages
    compiled = next(
        i for i, line in enumerate(lines) if line.startswith("compiled the training step in ")
    )
    first_row = next(i for i, line in enumerate(lines) if line.startswith("step 4/8 [train]"))
    assert compiled < first_row and "a log line every 4 steps" in lines[compiled]
    rows = _rows(tmp_path)
    assert "compile_seconds" in rows[0] and "compile_seconds" not in rows[1]


def test_run_dir_holds_config_checkpoints_model_and_tensorboard(trained_run):
    run_dir, _ = trained_run
    names = set(os.listdir(run_dir))
    assert {
        "config.toml",
        "model.weights.h5",
        "metrics.jsonl",
        "checkpoints",
        "tensorboard",
    } <= names
    assert sorted(os.listdir(os.path.join(run_dir, "checkpoints"))) == [
        "step_00000060",
        "step_00000120",
    ]
    assert os.listdir(os.path.join(run_dir, "tensorboard"))
    assert "profile" not in names  # no train.profile window: no trace


def test_load_returns_the_trained_model(trained_run, tiny_data):
    run_dir, _ = trained_run
    model = kroberta.load(str(run_dir))
    assert model.kroberta_config.train.steps == 120
    x = {
        "token_ids": np.full((2, 32), 9, "int32"),
        "padding_mask": np.ones((2, 32), "int32"),
        "mask_positions": np.zeros((2, 6), "int32"),
    }
    assert np.isfinite(np.asarray(model(x))).all()


def test_a_model_saved_into_a_new_directory_loads_back(trained_run, tmp_path):
    """kroberta.save of a loaded (fine-tuned, imported) model writes its config too."""
    model = kroberta.load(str(trained_run[0]))
    kroberta.save(model, str(tmp_path / "saved"))
    assert sorted(os.listdir(tmp_path / "saved")) == ["config.toml", "model.weights.h5"]
    again = kroberta.load(str(tmp_path / "saved"))
    assert again.kroberta_config.model == model.kroberta_config.model
    for a, b in zip(model.get_weights(), again.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_rerun_of_a_finished_run_trains_nothing(trained_run, tiny_data, caplog):
    run_dir, _ = trained_run
    before = _weights(run_dir)
    saved_at = os.stat(run_dir / "model.weights.h5").st_mtime_ns
    config = tiny_config(tiny_data, run_dir, steps=120, eval_every=60, checkpoint_every=60)
    summary = train(config)
    assert summary["start_step"] == 120 and summary["final_step"] == 120
    assert summary["outcome"] is Outcome.NOTHING_TO_DO
    out = caplog.text
    assert f"the run finished at step 120; its model is in {run_dir}. Nothing to train" in out
    assert "model saved" not in out
    assert os.stat(run_dir / "model.weights.h5").st_mtime_ns == saved_at  # not written again
    after = _weights(run_dir)
    for key in before:
        np.testing.assert_array_equal(before[key], after[key])


@pytest.mark.slow  # the dropout case below resumes bitwise too, in the default suite
def test_resumed_run_equals_uninterrupted_run(tiny_data, tmp_path):
    kwargs = dict(steps=60, eval_every=30, checkpoint_every=30)
    straight = tmp_path / "straight"
    train(tiny_config(tiny_data, straight, **kwargs))
    resumed = tmp_path / "resumed"
    first = train(tiny_config(tiny_data, resumed, **kwargs), until_step=30)
    assert first["final_step"] == 30
    second = train(tiny_config(tiny_data, resumed, **kwargs))
    assert second["start_step"] == 30 and second["final_step"] == 60
    a, b = _weights(straight), _weights(resumed)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])  # bitwise on CPU
    steps = [r["step"] for r in _rows(resumed)]
    assert steps == sorted(set(steps)) == list(range(10, 61, 10))


# One device takes ~2 minutes on 2 cores: the 4-device case stays in the default suite.
@pytest.mark.parametrize(
    "devices", [pytest.param(4, marks=pytest.mark.stack), pytest.param(1, marks=pytest.mark.slow)]
)
def test_runs_with_dropout_resume_bitwise_on_four_devices_and_on_one(tiny_data, tmp_path, devices):
    """Dropout on (hashed masks on CPU, kroberta.model.dropout): resumes bitwise however split."""

    def config(run_dir):
        c = tiny_config(tiny_data, run_dir, steps=20, eval_every=10, checkpoint_every=10)
        return dataclasses.replace(
            c,
            model=dataclasses.replace(c.model, dropout=0.1),
            distributed=dataclasses.replace(c.distributed, devices=devices),
        )

    straight = train(config(tmp_path / "straight"))
    assert straight["devices"] == devices
    train(config(tmp_path / "resumed"), until_step=10)
    train(config(tmp_path / "resumed"))
    a, b = _weights(tmp_path / "straight"), _weights(tmp_path / "resumed")
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    losses = [r["loss"] for r in _rows(tmp_path / "straight")]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)


def test_refuses_to_resume_a_different_model(trained_run, tiny_data):
    run_dir, _ = trained_run
    config = tiny_config(tiny_data, run_dir, steps=120, eval_every=60, checkpoint_every=60)
    import dataclasses

    other = dataclasses.replace(config, model=dataclasses.replace(config.model, hidden_dim=64))
    with pytest.raises(
        ConfigError, match=r"holds a run of a different model \(changed: model.hidden_dim\)"
    ):
        train(other)


def test_a_run_dir_holding_other_output_is_refused_before_any_write(tiny_data, tmp_path):
    data = tmp_path / "data"  # as prepare leaves it: the run would mix into it
    data.mkdir()
    (data / "manifest.json").write_text("{}")
    with pytest.raises(
        ConfigError,
        match=rf"run_dir: {data} holds prepared data "
        r"\(manifest.json\); a run goes into a directory of its own",
    ):
        train(tiny_config(tiny_data, data))
    assert os.listdir(data) == ["manifest.json"]


def test_a_new_start_is_not_a_new_model(trained_run, tiny_data, tmp_path):
    # model.initializer_range shapes only the first weights; the checkpoint holds them.
    import dataclasses
    import shutil

    run_dir = tmp_path / "copy"
    shutil.copytree(trained_run[0], run_dir)
    config = tiny_config(tiny_data, run_dir, steps=120, eval_every=60, checkpoint_every=60)
    other = dataclasses.replace(
        config, model=dataclasses.replace(config.model, initializer_range=0.1)
    )
    assert other.model != config.model
    assert train(other)["final_step"] == 120  # found the finished run, did not refuse it


def test_changed_training_settings_on_a_finished_run_are_refused_or_recorded(
    trained_run, tiny_data, tmp_path
):
    import dataclasses
    import shutil

    run_dir = tmp_path / "copy"
    shutil.copytree(trained_run[0], run_dir)
    config = tiny_config(tiny_data, run_dir, steps=120, eval_every=60, checkpoint_every=60)
    before = (run_dir / "config.toml").read_text()
    faster = dataclasses.replace(
        config, train=dataclasses.replace(config.train, learning_rate=1e-3)
    )
    with pytest.raises(
        ConfigError,
        match=r"holds a run trained with other settings "
        r"\(train.learning_rate 0.003 -> 0.001\); .*"
        r"--accept-changes \(accept_changes=True\)",
    ):
        train(faster)
    assert (run_dir / "config.toml").read_text() == before  # still says how it was trained
    # Logging and evaluation settings may change: recorded, not refused.
    quieter = dataclasses.replace(config, train=dataclasses.replace(config.train, log_every=20))
    assert train(quieter)["final_step"] == 120
    # Asked for: continued and recorded.
    assert train(faster, accept_changes=True)["final_step"] == 120
    rows = [
        json.loads(line) for line in (run_dir / "config_changes.jsonl").read_text().splitlines()
    ]
    assert rows[0]["changed"].pop("run_dir")[1] == str(run_dir)  # copied: another directory
    assert rows == [
        {"step": 120, "changed": {"train.log_every": [10, 20]}},
        {
            "step": 120,
            "changed": {"train.learning_rate": [0.003, 0.001], "train.log_every": [20, 10]},
        },
    ]
    assert "learning_rate = 0.001" in (run_dir / "config.toml").read_text()


def test_a_finished_run_trained_on_keeps_no_stale_model_file(
    trained_run, tiny_data, tmp_path, caplog
):
    """More steps on a finished run: its model file (step 120) goes when training goes on,
    and a stop at --until-step writes none, so `kroberta.load` reads the newest weights."""
    import shutil

    run_dir = tmp_path / "longer"
    shutil.copytree(trained_run[0], run_dir)
    config = tiny_config(tiny_data, run_dir, steps=140, eval_every=60, checkpoint_every=60)
    caplog.clear()
    summary = train(config, until_step=130, accept_changes=True)
    assert summary["final_step"] == 130 and summary["outcome"] is Outcome.UNTIL_STEP
    out = caplog.text
    assert "model.weights.h5 of step 120 removed: the run trains on" in out
    assert "stopped at step 130 of 140 (--until-step) with a checkpoint" in out
    assert "model saved" not in out and not (run_dir / "model.weights.h5").exists()
    caplog.clear()
    loaded = kroberta.load(str(run_dir))
    assert "no final model yet; loading the checkpoint at step 130" in caplog.text
    newest = kroberta.load(str(run_dir), checkpoint="last")
    assert loaded.kroberta_step == newest.kroberta_step == 130
    for a, b in zip(loaded.get_weights(), newest.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_vocabulary_smaller_than_the_data_is_a_data_error(tiny_data, tmp_path):
    config = tiny_config(tiny_data, tmp_path / "run", steps=10, warmup_steps=0)
    import dataclasses

    config = dataclasses.replace(
        config, model=dataclasses.replace(config.model, vocabulary_size=100)
    )
    with pytest.raises(
        Exception,
        match=r"record \d+: feature 'input_ids' holds id \d+ outside the vocabulary \[0, 100\)",
    ):
        train(config)


def test_cli_trains_the_seed_format_and_reports_errors(tiny_data, tmp_path):
    run_dir = tmp_path / "cli"
    base = [
        sys.executable,
        "-m",
        "kroberta.train",
        "--config",
        "tiny",
        f"--data.train={tiny_data}/train-*.tfrecord",
        f"--run_dir={run_dir}",
    ]
    ok = subprocess.run(
        base + ["--train.steps=20", "--train.checkpoint_every=10", "--train.eval_every=0"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert "step 20/20 [train]" in ok.stderr and "4 cpu device(s)" in ok.stderr
    bad = subprocess.run(
        base + ["--train.steps=20", f"--data.validation={tmp_path}/none-*"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert bad.returncode == 2
    assert f"error: data.validation: no file matches '{tmp_path}/none-*'" in bad.stderr
    assert "Traceback" not in bad.stderr


@pytest.mark.parametrize("key", ["init_from_hf", "init_from_keras_hub"])
def test_a_missing_directory_to_initialise_from_is_named_before_the_data_are_read(tmp_path, key):
    config = dataclasses.replace(
        tiny_config(tmp_path / "no-data", tmp_path / "run"), **{key: str(tmp_path / "nope")}
    )
    with pytest.raises(ConfigError, match=rf"{key}: '.*nope' is not a directory \(it should be "):
        train(config)


@pytest.mark.parametrize("until_step", [0, -5, "50", 2.5])
def test_an_until_step_below_1_is_refused_before_anything_is_written(tmp_path, until_step):
    config = tiny_config(tmp_path / "no-data", tmp_path / "run", steps=20)
    with pytest.raises(
        ConfigError,
        match=rf"until_step \(--until-step\) = {until_step!r}: give "
        r"the step to stop after, 1 to train.steps \(20\)",
    ):
        train(config, until_step=until_step)
    assert not (tmp_path / "run").exists()


def test_a_run_from_a_checkpoint_logs_its_validation_loss_at_step_0(tiny_data, tmp_path):
    """The starting checkpoint's loss is the first validation row: what the training
    improved on, with no script. At a learning rate of ~0 the step-2 evaluation sees the
    same weights, so the same loss; resumed, the row is not written again."""
    from kroberta.model.mlm import build_model

    config = tiny_config(
        tiny_data,
        tmp_path / "run",
        steps=4,
        warmup_steps=0,
        log_every=2,
        eval_every=2,
        checkpoint_every=2,
        learning_rate=1e-12,
        steps_per_execution=1,
    )
    kroberta.export_keras_hub(build_model(config.model, seed=42), str(tmp_path / "preset"))
    config = dataclasses.replace(config, init_from_keras_hub=str(tmp_path / "preset"))
    assert train(config, until_step=2)["outcome"] is Outcome.UNTIL_STEP
    assert train(config)["outcome"] is Outcome.FINISHED
    validation = _rows(tmp_path / "run", "validation")
    assert [r["step"] for r in validation] == [0, 2, 4]
    assert validation[0]["loss"] == pytest.approx(validation[1]["loss"], abs=1e-4)
    assert validation[0]["loss"] > 0 and 0 <= validation[0]["masked_accuracy"] <= 1

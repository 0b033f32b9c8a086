"""The run directory read once (`read_run_dir`) and what `prepare_run_dir` decides from it."""

import dataclasses
import os

import pytest

from kroberta import storage
from kroberta.config import config_path, load_toml, to_toml
from kroberta.errors import ConfigError
from kroberta.training.checkpoint import COMMIT_FILE
from kroberta.training.run_dir import prepare_run_dir, read_run_dir

pytestmark = pytest.mark.fast


def _run_with_checkpoint(run_dir, config, step=20, model=False):
    """A run directory as a run leaves it: config.toml, one complete checkpoint, and the
    final model's file when `model`."""
    checkpoint = run_dir / "checkpoints" / f"step_{step:08d}"
    checkpoint.mkdir(parents=True)
    (checkpoint / COMMIT_FILE).write_text("{}")
    (run_dir / "checkpoints" / "step_00000030.orbax-checkpoint-tmp-1").mkdir()  # not complete
    (run_dir / "config.toml").write_text(to_toml(config))
    if model:
        (run_dir / "model.weights.h5").write_bytes(b"")


def test_a_new_run_dir_is_created_and_holds_nothing(tmp_path):
    state = read_run_dir(str(tmp_path / "new"))
    assert (state.created, state.checkpoints, state.recorded, state.model) == (True, (), None, None)
    assert not os.path.exists(tmp_path / "new")  # reading writes nothing


def test_a_run_to_resume_is_read_with_its_checkpoints_config_and_model(tmp_path):
    config = dataclasses.replace(load_toml(config_path("tiny")), run_dir=str(tmp_path))
    _run_with_checkpoint(tmp_path, config, model=True)
    state = read_run_dir(str(tmp_path))
    assert not state.created
    assert state.checkpoints == ((20, str(tmp_path / "checkpoints" / "step_00000020")),)
    assert state.recorded == config
    assert state.model == str(tmp_path / "model.weights.h5")


def test_a_config_without_checkpoints_is_no_run_to_resume(tmp_path):
    (tmp_path / "config.toml").write_text(to_toml(load_toml(config_path("tiny"))))
    assert read_run_dir(str(tmp_path)).recorded is None


@pytest.mark.parametrize(
    "marker, kind",
    [
        ("manifest.json", "prepared data"),
        ("classifier.json", "a fine-tuned classifier's folder"),
        ("model.safetensors", "a Hugging Face export"),
        ("metadata.json", "a keras-hub preset"),
    ],
)
def test_a_run_dir_holding_another_output_is_refused_at_once(tmp_path, marker, kind):
    (tmp_path / marker).write_text("{}")
    with pytest.raises(ConfigError) as error:
        read_run_dir(str(tmp_path))
    assert str(error.value) == (
        f"run_dir: {tmp_path} holds {kind} ({marker}); a run goes into a directory of its "
        "own: use another --run_dir"
    )


def test_starting_over_goes_on_without_checkpoints_and_a_check_writes_nothing(tmp_path):
    config = dataclasses.replace(load_toml(config_path("tiny")), run_dir=str(tmp_path))
    _run_with_checkpoint(tmp_path, config)
    state = read_run_dir(str(tmp_path))
    other = dataclasses.replace(config, model=dataclasses.replace(config.model, hidden_dim=64))
    with pytest.raises(ConfigError, match=r"holds a run of a different model"):
        prepare_run_dir(other, state, force=False, accept_changes=False, write=False)
    before = sorted(os.listdir(tmp_path / "checkpoints"))
    going_on = prepare_run_dir(other, state, force=True, accept_changes=False, write=False)
    assert (going_on.checkpoints, going_on.recorded) == ((), None)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == before  # only checked
    assert prepare_run_dir(config, state, force=True, accept_changes=False, write=False) == state


def test_a_run_dir_without_room_for_a_checkpoint_is_refused(tmp_path):
    with pytest.raises(ConfigError) as error:  # an exbibyte: never free
        storage.check_room(str(tmp_path), 2**60, "a checkpoint", key="run_dir")
    assert str(error.value).startswith(f"run_dir: {tmp_path} has ")
    assert str(error.value).endswith(
        " MiB free but a checkpoint needs about 1099511627776.0 MiB; free some space or "
        "choose another --run_dir"
    )

"""kroberta.atomic: whole files under their final names, with the usual permissions."""

import os
import stat

import numpy as np
import pytest

from kroberta.atomic import atomic_path, atomic_write


@pytest.fixture
def umask_022():
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_private_staged_file_gets_the_usual_mode(tmp_path, umask_022):
    from safetensors.numpy import save_file

    path = tmp_path / "model.safetensors"
    with atomic_path(path) as tmp:
        save_file({"w": np.zeros(2, np.float32)}, tmp)
        assert mode(tmp) == 0o600  # what safetensors makes: the case this guards
    assert mode(path) == 0o644


def test_the_mode_follows_the_umask(tmp_path):
    previous = os.umask(0o077)
    try:
        with atomic_write(tmp_path / "x.txt") as f:
            f.write("x")
    finally:
        os.umask(previous)
    assert mode(tmp_path / "x.txt") == 0o600


def test_a_failed_write_leaves_nothing(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with atomic_write(tmp_path / "x.txt") as f:
            f.write("half")
            raise KeyboardInterrupt
    assert os.listdir(tmp_path) == []


def test_export_hf_files_are_readable_by_others(tmp_path, umask_022):
    import kroberta
    from kroberta.config import ModelConfig
    from kroberta.model.mlm import build_model

    model = build_model(
        ModelConfig(
            vocabulary_size=40,
            num_layers=1,
            num_heads=2,
            hidden_dim=16,
            intermediate_dim=32,
            max_sequence_length=16,
        )
    )
    out = kroberta.export_hf(model, str(tmp_path / "hf"))
    modes = {name: mode(os.path.join(out, name)) for name in os.listdir(out)}
    assert modes and set(modes.values()) == {0o644}, modes

"""Every entry point gives one model class, with one behaviour.

`kroberta.load` of a run, a Hugging Face directory and a keras-hub preset, the model
training builds and a `keras.saving` round trip are all `kroberta.MaskedLM`; Keras `fit`, `evaluate` and
`predict` take kroberta's / keras-hub's names, Hugging Face's names and a bare array on
each of them, and evaluate the same loss on the same batch.
"""

import dataclasses

import keras
import numpy as np
import pytest

import kroberta
from kroberta.config import Config
from kroberta.errors import InputError
from kroberta.model.masked_lm import MaskedLM
from kroberta.model.mlm import build_compiled_model
from kroberta.perf.plan import for_local_devices
from kroberta.training import final_model
from tests.interop.test_hf_no_torch import TINY, randomized_model

ROWS, SLOTS = 4, 3


def _inputs(model, seed=0):
    """(keras-hub names, Hugging Face names, bare ids, labels) of one batch."""
    rng = np.random.default_rng(seed)
    length, vocabulary = TINY.max_sequence_length, TINY.vocabulary_size
    ids = rng.integers(5, vocabulary, (ROWS, length)).astype("int32")
    mask = np.ones_like(ids)
    positions = np.tile(np.arange(1, SLOTS + 1, dtype="int32"), (ROWS, 1))
    labels = np.take_along_axis(ids, positions, axis=1)
    labels[0, -1] = -100  # a slot with no masked token
    keras_hub_names = {"token_ids": ids, "padding_mask": mask, "mask_positions": positions}
    hf_names = {"input_ids": ids, "attention_mask": mask, "mask_positions": positions}
    return keras_hub_names, hf_names, ids, labels


@pytest.fixture(scope="module")
def entry_points(tmp_path_factory):
    """One set of weights, reached through every entry point."""
    source = randomized_model(seed=3)
    root = tmp_path_factory.mktemp("entry_points")
    run = root / "run"
    run.mkdir()
    config = Config(model=TINY)
    (run / "config.toml").write_text(kroberta.config.to_toml(config))
    final_model.save(source, str(run))
    kroberta.export_hf(source, str(root / "hf"))
    kroberta.export_keras_hub(source, str(root / "keras_hub"))
    trained = build_compiled_model(for_local_devices(config))
    trained.set_weights(source.get_weights())
    keras_file = str(root / "model.keras")
    loaded = kroberta.load(str(run))
    loaded.save(keras_file)
    return {
        "load": loaded,
        "from_hf": kroberta.load(str(root / "hf")),
        "from_keras_hub": kroberta.load(str(root / "keras_hub")),
        "training": trained,
        "keras.saving": keras.saving.load_model(keras_file),
    }


def test_every_entry_point_gives_the_one_class(entry_points):
    for name, model in entry_points.items():
        assert type(model) is MaskedLM, name
        assert isinstance(model, kroberta.MaskedLM), name


def test_fit_evaluate_and_predict_take_every_input_convention(entry_points):
    losses = {}
    for name, model in entry_points.items():
        keras_hub_names, hf_names, ids, labels = _inputs(model)
        model.compile(optimizer=keras.optimizers.SGD(0.0))  # "auto": the masked loss
        for convention, x in (("keras-hub", keras_hub_names), ("hugging face", hf_names)):
            loss = model.evaluate(x, labels, batch_size=ROWS, verbose=0, return_dict=True)["loss"]
            losses[name, convention] = loss
            history = model.fit(x, labels, batch_size=ROWS, epochs=1, verbose=0).history
            assert np.isfinite(history["loss"][0]), (name, convention)
            logits = model.predict(x, batch_size=ROWS, verbose=0)
            assert logits.shape == (ROWS, SLOTS, TINY.vocabulary_size), (name, convention)
        every_position = model.predict(ids, batch_size=ROWS, verbose=0)
        assert every_position.shape == (ROWS, TINY.max_sequence_length, TINY.vocabulary_size)
    # One loss: the mean over real slots (the -100 slot left out), equal on every entry point.
    reference = losses["load", "keras-hub"]
    assert reference > np.log(TINY.vocabulary_size) * 0.5
    for key, loss in losses.items():
        assert loss == pytest.approx(reference, rel=1e-5), key


def test_the_loss_leaves_out_unlabelled_slots(entry_points):
    model = entry_points["from_hf"]
    keras_hub_names, _, _, labels = _inputs(model)
    model.compile(optimizer=keras.optimizers.SGD(0.0))
    with_padding = model.evaluate(keras_hub_names, labels, verbose=0, return_dict=True)["loss"]
    logits = model.predict(keras_hub_names, verbose=0).astype("float64")
    log_probs = (
        logits
        - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True))
        - logits.max(-1, keepdims=True)
    )
    real = labels != -100
    expected = -np.take_along_axis(log_probs, np.where(real, labels, 0)[..., None], -1)[..., 0]
    assert with_padding == pytest.approx(expected[real].mean(), rel=1e-5)


def test_a_checkpoint_loads_without_compiling(tmp_path, monkeypatch):
    from kroberta.model import mlm
    from kroberta.training import checkpoint

    config = dataclasses.replace(Config(model=TINY), run_dir=str(tmp_path))
    trained = build_compiled_model(for_local_devices(config))
    trained.set_weights(randomized_model(seed=5).get_weights())
    (tmp_path / "config.toml").write_text(kroberta.config.to_toml(config))
    writer = checkpoint.Writer(str(tmp_path), keep=1, asynchronous=False)
    writer.save(trained, 7)
    writer.close()
    compiled = []
    monkeypatch.setattr(mlm, "compile_model", lambda *a, **k: compiled.append(a))
    model = kroberta.load(str(tmp_path), checkpoint=7)
    assert compiled == [] and not model.optimizer.built
    assert model.kroberta_step == 7
    for ours, theirs in zip(model.get_weights(), trained.get_weights()):
        np.testing.assert_array_equal(ours, theirs)


def test_fit_and_evaluate_without_labels_say_what_to_give_and_leave_the_model_usable(entry_points):
    model = entry_points["load"]
    keras_hub_names, _, ids, labels = _inputs(model)
    model.compile(optimizer=keras.optimizers.SGD(0.0))
    for call, x in ((model.fit, keras_hub_names), (model.evaluate, ids)):
        with pytest.raises(
            InputError,
            match=r"model\.(fit|evaluate): no labels: give y \(the labels "
            r"at mask_positions, -100 = none\)",
        ):
            call(x, verbose=0)
    assert np.isfinite(model.evaluate(keras_hub_names, labels, verbose=0, return_dict=True)["loss"])

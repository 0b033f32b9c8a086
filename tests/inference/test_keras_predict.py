"""`model.predict` on a loaded model: the inputs Keras and Hugging Face users pass work,
wrong ones are refused with what to pass, and no failure leaves the model unusable."""

import numpy as np
import pytest
import tensorflow as tf

import kroberta
from kroberta.errors import InputError
from tests.conftest import TINY_LENGTH, TINY_VOCAB


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    from kroberta.config import config_path, load_toml
    from tests.conftest import saved_tiny_model

    config = load_toml(config_path("tiny"))
    return saved_tiny_model(tmp_path_factory.mktemp("keras_predict"), config, seed=0)


def _inputs(rows=3, length=TINY_LENGTH):
    rng = np.random.default_rng(0)
    ids = rng.integers(5, TINY_VOCAB, (rows, length)).astype("int32")
    ids[:, -4:] = 1  # padding
    return ids, (ids != 1).astype("int32")


def test_hugging_face_and_keras_hub_names_give_the_same_logits(loaded):
    import keras

    ids, mask = _inputs()
    positions = np.tile(np.arange(TINY_LENGTH, dtype="int32"), (3, 1))
    reference = loaded.predict(
        {"token_ids": ids, "padding_mask": mask, "mask_positions": positions}, verbose=0
    )
    assert reference.shape == (3, TINY_LENGTH, TINY_VOCAB)
    # As in a notebook after training: the run's distribution is still set (3 rows on 4 devices).
    keras.distribution.set_distribution(keras.distribution.DataParallel())
    try:
        hf = loaded.predict({"input_ids": ids, "attention_mask": mask}, verbose=0)
        bare = loaded.predict(ids, verbose=0)  # padding from the pad id
        some = loaded.predict(
            {"input_ids": ids, "attention_mask": mask, "mask_positions": positions[:, 2:5]},
            verbose=0,
        )
    finally:
        keras.distribution.set_distribution(None)
    np.testing.assert_allclose(hf, reference, atol=1e-6)
    np.testing.assert_allclose(bare, reference, atol=1e-6)
    np.testing.assert_allclose(some, reference[:, 2:5], atol=1e-6)


def test_wrong_inputs_are_refused_and_the_model_stays_usable(loaded):
    ids, mask = _inputs()
    with pytest.raises(InputError, match="unknown input.*'inputs'.*pass a"):
        loaded.predict({"inputs": ids}, verbose=0)
    with pytest.raises(InputError, match="reads at most 32"):
        loaded.predict(np.ones((2, TINY_LENGTH + 8), "int32"), verbose=0)
    # What a gather would clamp into a wrong answer, and text instead of ids.
    outside = ids.copy()
    outside[1, 3] = TINY_VOCAB
    with pytest.raises(
        InputError,
        match=rf"input_ids\[1, 3\] = {TINY_VOCAB} is outside "
        rf"the vocabulary \[0, {TINY_VOCAB}\)",
    ):
        loaded.predict({"input_ids": outside}, verbose=0)
    with pytest.raises(InputError, match=r"token_ids\[0, 0\] = -1 is outside"):
        loaded.predict(np.full((1, 4), -1), verbose=0)
    with pytest.raises(
        InputError,
        match=rf"mask_positions\[2, 1\] = {TINY_LENGTH} is "
        rf"outside the sequence's positions",
    ):
        positions = np.array([[0, 1], [0, 1], [0, TINY_LENGTH]])
        loaded.predict({"token_ids": ids, "mask_positions": positions}, verbose=0)
    with pytest.raises(
        InputError,
        match="holds strings, not token ids; "
        r"kroberta.fill_mask\(model, texts\)",
    ):
        loaded.predict(["The <mask> sat on the mat."], verbose=0)
    # A failure Keras meets only while tracing its step (a dataset's element): after
    # Keras has detached the model's variables.
    bad = tf.data.Dataset.from_tensor_slices({"input_ids": ids, "oops": mask}).batch(3)
    with pytest.raises(InputError, match="unknown input"):
        loaded.predict(bad, verbose=0)
    # kroberta.dataset's default batches carry the keys a training run's step masks from.
    keyed = tf.data.Dataset.from_tensor_slices(
        {"token_ids": ids, "padding_mask": mask, "mask_keys": np.arange(3, dtype="uint32")}
    ).batch(3)
    with pytest.raises(
        InputError,
        match=r"model.evaluate: the batches carry 'mask_keys', .*"
        r"kroberta.dataset\(config, masks_on_host=True\)",
    ):
        loaded.evaluate(keyed, verbose=0)
    assert all(v.value is not None for v in loaded.variables)
    out = loaded.predict({"input_ids": ids, "attention_mask": mask}, verbose=0)
    assert out.shape == (3, TINY_LENGTH, TINY_VOCAB) and np.isfinite(out).all()
    result = kroberta.predict(loaded, {"token_ids": ids, "padding_mask": mask}, output="embeddings")
    assert np.isfinite(result["embeddings"]).all()


def test_evaluate_counts_the_real_label_slots_and_fit_takes_predict_s_inputs(loaded):
    """compile's defaults skip the -100 slots (kroberta.dataset's batches hold them), and
    fit / evaluate take Hugging Face's names; a failed fit leaves the model usable.
    Last in the module: it trains the shared model."""
    ids, mask = _inputs(rows=4)
    labels = np.full(ids.shape, -100)
    labels[:, 2] = ids[:, 2]  # one real slot per row, at position 2
    logits = loaded.predict({"input_ids": ids, "attention_mask": mask}, verbose=0)
    log_probs = logits[:, 2] - np.log(np.exp(logits[:, 2]).sum(-1, keepdims=True))
    expected = -log_probs[np.arange(4), ids[:, 2]].mean()
    result = loaded.evaluate(
        {"input_ids": ids, "attention_mask": mask},
        labels,
        batch_size=4,
        verbose=0,
        return_dict=True,
    )
    assert result["loss"] == pytest.approx(expected, rel=1e-4)
    assert result["perplexity"] == pytest.approx(np.exp(expected), rel=1e-4)
    with pytest.raises(InputError, match=r"model.fit: unknown input\(s\) \['inputs'\]"):
        loaded.fit({"inputs": ids}, labels, verbose=0)
    # A dataset's elements are renamed in the step; one that fails there (after Keras has
    # detached the variables) leaves them attached.
    bad = tf.data.Dataset.from_tensor_slices(({"oops": ids}, labels)).batch(4)
    with pytest.raises(InputError, match=r"unknown input\(s\) \['oops'\]"):
        loaded.fit(bad, verbose=0)
    assert all(v.value is not None for v in loaded.variables)
    named = tf.data.Dataset.from_tensor_slices(({"input_ids": ids}, labels)).batch(4)
    assert np.isfinite(loaded.evaluate(named, verbose=0, return_dict=True)["loss"])
    history = loaded.fit(
        {"input_ids": ids, "attention_mask": mask}, labels, batch_size=4, epochs=2, verbose=0
    ).history
    assert history["loss"][1] < history["loss"][0]
    assert np.isfinite(loaded.predict(ids, verbose=0)).all()

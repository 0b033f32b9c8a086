import importlib

import numpy as np
import pytest
import tensorflow as tf

import kroberta
from kroberta.config import Config, ModelConfig
from kroberta.data.synthetic import make_sequences, mask_once, write_tfrecord
from kroberta.errors import ArgumentKindError, InputError
from kroberta.model.metrics import MaskedLMLoss
from tests.conftest import jit_traces, saved_tiny_model

V, L = 300, 16
TINY = ModelConfig(
    vocabulary_size=V,
    num_layers=2,
    num_heads=2,
    hidden_dim=16,
    intermediate_dim=32,
    max_sequence_length=L,
    dropout=0.0,
)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("predict_run")
    config = Config(model=TINY, run_dir=str(run_dir))
    return saved_tiny_model(run_dir, config, seed=1)


def _arrays(n, seed=0, labels=True, rate=0.2):
    ids, mask = make_sequences(n, L, V, seed=seed, min_fill=0.5)
    masked, lab = mask_once(ids, mask, V, seed=seed, rate=rate)
    out = {"input_ids": masked, "attention_mask": mask}
    if labels:
        out["labels"] = lab
    return out


def _direct_logits(model, arrays, positions):
    x = {
        "token_ids": arrays["input_ids"].astype("int32"),
        "padding_mask": arrays["attention_mask"].astype("int32"),
        "mask_positions": positions.astype("int32"),
    }
    return np.asarray(model.predict_on_batch(x))


@pytest.mark.stack
def test_top_k_equals_argsort_of_the_logits(model):
    arrays = _arrays(10)
    out = kroberta.predict(model, arrays, output="top_k", k=4, positions="all")
    assert out["token_ids"].shape == (10, L, 4) and out["log_probs"].shape == (10, L, 4)
    logits = _direct_logits(model, arrays, np.tile(np.arange(L), (10, 1)))
    np.testing.assert_array_equal(out["token_ids"], np.argsort(-logits, axis=-1)[..., :4])
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    np.testing.assert_allclose(
        out["log_probs"], np.sort(log_probs, -1)[..., ::-1][..., :4], atol=1e-5
    )
    assert (np.diff(out["log_probs"], axis=-1) <= 0).all()  # best first
    np.testing.assert_array_equal(out["valid"], arrays["attention_mask"] == 1)


def test_1003_examples_in_batches_of_64_on_4_devices_keep_every_row(model):
    arrays = _arrays(1003, seed=3)
    out = kroberta.predict(model, arrays, output="logits", batch_size=64, slots=8)
    assert out["logits"].shape == (1003, 8, V)
    expected = _direct_logits(model, arrays, out["positions"])
    np.testing.assert_allclose(out["logits"], expected, atol=1e-4)
    # An example predicted alone gives its row of the batched result.
    for i in (0, 517, 1002):
        alone = kroberta.predict(
            model,
            {k: v[i : i + 1] for k, v in arrays.items()},
            output="logits",
            batch_size=4,
            slots=8,
        )
        np.testing.assert_allclose(alone["logits"][0], out["logits"][i], atol=1e-5)


def test_positions_are_the_labelled_or_masked_positions(model):
    arrays = _arrays(20, seed=4)
    out = kroberta.predict(model, arrays, output="top_k", k=1, slots=L)
    for row in range(20):
        expected = np.flatnonzero(arrays["labels"][row] != -100)
        assert list(out["positions"][row][out["valid"][row]]) == list(expected)
    no_labels = {k: v for k, v in arrays.items() if k != "labels"}
    out = kroberta.predict(model, no_labels, output="top_k", k=1, slots=L)
    for row in range(20):
        expected = np.flatnonzero(
            (no_labels["input_ids"][row] == 4) & (arrays["attention_mask"][row] == 1)
        )
        assert list(out["positions"][row][out["valid"][row]]) == list(expected)


@pytest.mark.parametrize("labels", [True, False])
def test_positions_beyond_the_slots_are_counted_in_a_warning(model, labels):
    """The program keeps each row's first M marked positions and counts the rest."""
    arrays = _arrays(20, seed=4, labels=labels, rate=0.4)
    marked = (
        arrays["labels"] != -100
        if labels
        else (arrays["input_ids"] == 4) & (arrays["attention_mask"] == 1)
    )
    dropped = int(np.maximum(marked.sum(1) - 3, 0).sum())
    assert dropped > 0
    with pytest.warns(UserWarning, match=rf"^{dropped} masked position\(s\) beyond the 3 slots"):
        out = kroberta.predict(model, arrays, output="top_k", k=1, slots=3, batch_size=8)
    for row in range(20):
        first_three = np.flatnonzero(marked[row])[:3]
        assert list(out["positions"][row][out["valid"][row]]) == list(first_three)


def test_arrays_datasets_and_files_give_the_same_result(model, tmp_path):
    arrays = _arrays(37, seed=5)
    path = str(tmp_path / "p.tfrecord")
    write_tfrecord(path, arrays["input_ids"], arrays["attention_mask"], arrays["labels"])
    results = [
        kroberta.predict(model, arrays, k=3),
        kroberta.predict(model, tf.data.Dataset.from_tensor_slices(arrays), k=3),
        kroberta.predict(model, tf.data.Dataset.from_tensor_slices(arrays).batch(5), k=3),
        kroberta.predict(model, path, k=3),
        kroberta.predict(model, [str(tmp_path / "p*.tfrecord")], k=3),
    ]
    for other in results[1:]:
        assert other.keys() == results[0].keys()
        for key in results[0]:
            np.testing.assert_allclose(other[key], results[0][key], atol=1e-6)


@pytest.mark.stack
def test_loss_equals_the_training_loss_on_the_same_batch(model):
    arrays = _arrays(32, seed=6)
    out = kroberta.predict(model, arrays, output="loss", slots=L)
    logits = _direct_logits(model, arrays, out["positions"])
    slot_labels = np.where(
        out["valid"], np.take_along_axis(arrays["labels"], out["positions"], 1), -100
    )
    training_loss = float(MaskedLMLoss()(slot_labels, logits))
    weights = out["num_predictions"]
    assert np.sum(out["loss"] * weights) / weights.sum() == pytest.approx(training_loss, rel=1e-5)
    assert ((out["masked_accuracy"] >= 0) & (out["masked_accuracy"] <= 1)).all()


def test_embeddings_are_the_mean_of_real_tokens(model):
    arrays = _arrays(6, seed=7)
    out = kroberta.predict(model, arrays, output="embeddings")
    assert out["embeddings"].shape == (6, 16)
    hidden = np.asarray(
        model.backbone.predict_on_batch(
            {
                "token_ids": arrays["input_ids"].astype("int32"),
                "padding_mask": arrays["attention_mask"].astype("int32"),
            }
        )
    )
    mask = arrays["attention_mask"][..., None]
    np.testing.assert_allclose(out["embeddings"], (hidden * mask).sum(1) / mask.sum(1), atol=1e-5)


def test_a_second_call_with_the_same_shapes_compiles_nothing(model):
    arrays = _arrays(40, seed=8)
    kroberta.predict(model, arrays, output="top_k", k=2, batch_size=8)
    with jit_traces() as traced:
        kroberta.predict(model, _arrays(23, seed=9), output="top_k", k=2, batch_size=8)
    assert "step" not in traced  # the predict program


def test_logits_over_the_memory_budget_is_a_clear_error(model):
    # Sizes in the unit that shows them (it said "0.0 GiB ... over the 0.0 GiB budget").
    with pytest.raises(
        InputError,
        match=r"is \d+\.\d MiB of float32, over the 1\.0 KiB "
        r"budget; use output='top_k'",
    ):
        kroberta.predict(
            model, _arrays(50), output="logits", positions="all", max_output_bytes=1000
        )


def test_bad_inputs_are_clear_errors(model):
    with pytest.raises(InputError, match="output='loss' needs labels"):
        kroberta.predict(model, _arrays(4, labels=False), output="loss")
    with pytest.raises(InputError, match="output must be one of"):
        kroberta.predict(model, _arrays(4), output="probabilities")
    bad = _arrays(4)
    bad["input_ids"][2, 3] = V + 5
    with pytest.raises(ValueError, match=rf"input_ids\[2, 3\] = {V + 5} is outside the vocabulary"):
        kroberta.predict(model, bad)
    bad = _arrays(4)
    bad["labels"][1, 2] = V  # a NaN loss, before
    with pytest.raises(
        ValueError,
        match=rf"labels\[1, 2\] = {V} is neither -100 \(no loss\) "
        rf"nor in the vocabulary \[0, {V}\)",
    ):
        kroberta.predict(model, bad, output="loss")
    floats = _arrays(4)
    floats["input_ids"] = floats["input_ids"] + 0.7  # truncated to ids, before
    with pytest.raises(
        ValueError,
        match=r"inputs\['input_ids'\]: expected integers, got "
        r"float64 values",
    ):
        kroberta.predict(model, floats)
    with pytest.raises(ValueError, match=r"inputs\['input_ids'\]: rows of different lengths"):
        kroberta.predict(
            model,
            {
                "input_ids": [[0, 4, 2], [0, 5, 6, 4, 2]],
                "attention_mask": [[1, 1, 1], [1, 1, 1, 1, 1]],
            },
        )
    with pytest.raises(ValueError, match=r"inputs: an empty list"):
        kroberta.predict(model, [])
    with pytest.raises(InputError, match=rf"k must be an integer in \[1, {V}\], got '5'"):
        kroberta.predict(model, _arrays(4), k="5")
    for batch_size in (0, -4):
        with pytest.raises(InputError, match=rf"batch_size must be >= 1 .*got {batch_size}"):
            kroberta.predict(model, _arrays(4), batch_size=batch_size)
    for slots in (0, -1, L + 1):
        with pytest.raises(InputError, match=rf"slots must be in \[1, {L}\] .*got {slots}"):
            kroberta.predict(model, _arrays(4), slots=slots)


def test_a_failure_mid_way_leaves_the_model_usable(model, tmp_path):
    arrays = _arrays(200, seed=10)
    before = kroberta.predict(model, arrays, k=2, batch_size=8)
    ids = arrays["input_ids"].copy()
    ids[150, 4] = V + 1
    path = str(tmp_path / "bad.tfrecord")
    write_tfrecord(path, ids, arrays["attention_mask"], arrays["labels"])
    with pytest.raises(ValueError, match=r"bad.tfrecord: record 150: feature 'input_ids' holds id"):
        kroberta.predict(model, path, k=2, batch_size=8)
    after = kroberta.predict(model, arrays, k=2, batch_size=8)
    np.testing.assert_array_equal(before["token_ids"], after["token_ids"])


def test_fill_mask_needs_a_tokenizer(model):
    with pytest.raises(InputError, match="fill_mask needs a tokenizer"):
        kroberta.fill_mask(model, "The <mask> sat.")


def test_fill_mask_names_a_bad_top_k_as_its_own_argument(model):
    vocabulary = model.kroberta_config.model.vocabulary_size
    for top_k in (0, vocabulary + 1, 2.0, True):
        with pytest.raises(InputError) as refused:
            kroberta.fill_mask(model, "The <mask> sat.", top_k=top_k)
        assert str(refused.value) == (
            f"fill_mask: top_k must be an integer in [1, {vocabulary}], got {top_k!r}"
        )


def test_cli_streams_to_npz(model, tmp_path):
    import subprocess
    import sys

    from tests.conftest import REPO

    arrays = _arrays(45, seed=11)
    data = str(tmp_path / "d.tfrecord")
    write_tfrecord(data, arrays["input_ids"], arrays["attention_mask"], arrays["labels"])
    out = str(tmp_path / "preds.npz")
    run_dir = str(model.kroberta_config.run_dir)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kroberta.predict",
            "--run",
            run_dir,
            "--data",
            data,
            "--output",
            "top_k",
            "--k",
            "3",
            "--slots",
            str(L),
            "--out",
            out,
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "\r" not in result.stderr  # not a terminal: no redrawn progress line
    assert "predict: 45/45 examples" in result.stderr
    saved = np.load(out)
    expected = kroberta.predict(model, arrays, k=3, slots=L)
    assert set(saved.files) == set(expected)
    for key in expected:
        np.testing.assert_allclose(saved[key], expected[key], atol=1e-6)
    missing = subprocess.run(
        [
            sys.executable,
            "-m",
            "kroberta.predict",
            "--run",
            str(tmp_path / "nope"),
            "--data",
            data,
            "--out",
            out,
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert missing.returncode == 2
    assert missing.stderr.startswith(f"error: --run: {tmp_path / 'nope'}: no such directory; give")
    # export words the same mistake the same way
    exported = subprocess.run(
        [
            sys.executable,
            "-m",
            "kroberta.export",
            "--run",
            str(tmp_path / "nope"),
            "--out",
            str(tmp_path / "hf"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert exported.returncode == 2 and exported.stderr == missing.stderr
    # A missing output folder is named before any prediction is made.
    no_folder = subprocess.run(
        [
            sys.executable,
            "-m",
            "kroberta.predict",
            "--run",
            run_dir,
            "--data",
            data,
            "--out",
            "nodir/sub/p.npz",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert no_folder.returncode == 2
    assert no_folder.stderr == (
        "error: --out: the folder 'nodir/sub' does not exist; create it "
        "first (mkdir -p nodir/sub)\n"
    )


def test_unmasked_inputs_say_that_nothing_was_predicted_and_what_to_use(model, tmp_path):
    """Sequences without <mask> and labels (what prepare writes) at positions='masked'."""
    import subprocess
    import sys

    from tests.conftest import REPO

    ids, mask = make_sequences(6, L, V, seed=3, min_fill=0.5)
    ids = np.where(ids == 4, 5, ids)  # no <mask> anywhere
    with pytest.warns(
        UserWarning,
        match=r"nothing was predicted: no position of the 6 "
        r"sequence\(s\) holds <mask>.*positions='all'",
    ):
        out = kroberta.predict(model, {"input_ids": ids, "attention_mask": mask}, k=2)
    assert not out["valid"].any()
    data = str(tmp_path / "unmasked.tfrecord")
    write_tfrecord(data, ids, mask)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kroberta.predict",
            "--run",
            str(model.kroberta_config.run_dir),
            "--data",
            data,
            "--out",
            str(tmp_path / "p.npz"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "warning: nothing was predicted" in result.stderr and "--positions all" in result.stderr


def test_kroberta_predict_stays_the_function(model):
    # `python -m kroberta.predict` runs a file that refuses to be imported: the import
    # would bind the module to the name `kroberta.predict`.
    with pytest.raises(ImportError, match="kroberta.cli.predict"):
        importlib.import_module("kroberta.predict")
    out = kroberta.predict(model, _arrays(3), k=1)
    assert out["token_ids"].shape[0] == 3


@pytest.mark.parametrize(
    "positions,labels",
    [
        ("masked", True),  # the labelled positions
        ("masked", False),  # the <mask> tokens
        ("all", True),
        ("all", False),
    ],
)
def test_array_batches_equal_the_tf_data_batches(positions, labels):
    from kroberta.inference import inputs

    config = Config(model=TINY)
    arrays = _arrays(21, seed=9, labels=labels, rate=0.4)
    from_arrays = inputs.as_examples(arrays, config)
    as_dataset = inputs.as_examples(tf.data.Dataset.from_tensor_slices(arrays), config)
    assert from_arrays.columns is not None and as_dataset.columns is None
    ours = list(inputs.batched(from_arrays, config, positions, 8))
    reference = list(inputs.batched(as_dataset, config, positions, 8))
    assert len(ours) == len(reference) == 3  # 21 rows: the last batch holds 3 fillers
    for mine, theirs in zip(ours, reference):
        assert mine.keys() == theirs.keys()
        for key in mine:
            assert mine[key].dtype == theirs[key].dtype, key
            np.testing.assert_array_equal(mine[key], theirs[key], err_msg=key)


def test_paths_bare_arrays_and_keras_hub_names_are_inputs_too(model, tmp_path):
    import pathlib

    import tensorflow as tf

    arrays = _arrays(12, seed=3)
    reference = kroberta.predict(model, arrays, k=2, positions="all")
    path = tmp_path / "x.tfrecord"
    write_tfrecord(str(path), arrays["input_ids"], arrays["attention_mask"], arrays["labels"])
    for inputs in (pathlib.Path(path), [pathlib.Path(path)]):
        got = kroberta.predict(model, inputs, k=2, positions="all")
        np.testing.assert_array_equal(got["token_ids"], reference["token_ids"])
    padded = arrays["input_ids"].copy()
    padded[arrays["attention_mask"] == 0] = model.kroberta_config.data.pad_token_id
    bare = kroberta.predict(model, padded, k=2, positions="all")
    np.testing.assert_array_equal(bare["token_ids"], reference["token_ids"])
    named = tf.data.Dataset.from_tensor_slices(
        {"token_ids": arrays["input_ids"], "padding_mask": arrays["attention_mask"]}
    )
    got = kroberta.predict(model, named, k=2, positions="all")
    np.testing.assert_array_equal(got["token_ids"], reference["token_ids"])


def test_a_path_where_a_model_goes_and_the_reverse_are_named(model, tmp_path):

    for call, name in (
        (lambda: kroberta.predict("runs/x", _arrays(2)), "predict"),
        (lambda: kroberta.fill_mask("runs/x", "a <mask>"), "fill_mask"),
        (lambda: kroberta.export_hf("runs/x", str(tmp_path / "hf")), "export_hf"),
        (lambda: kroberta.export_keras_hub("runs/x", str(tmp_path / "kh")), "export_keras_hub"),
    ):
        with pytest.raises(
            ArgumentKindError,
            match=rf"^{name}: expected a model .*got str; load "
            r"it first: model = kroberta.load\('runs/x'\)",
        ):
            call()
    assert not (tmp_path / "hf").exists() and not (tmp_path / "kh").exists()
    with pytest.raises(
        ArgumentKindError,
        match=r"kroberta.load: expected a directory's path, "
        r"got \w+ \(a model already",
    ):
        kroberta.load(model)
    with pytest.raises(ValueError, match="texts must be a string or a list of strings, got int"):
        kroberta.fill_mask(model, 5)

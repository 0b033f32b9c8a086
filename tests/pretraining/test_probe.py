"""The linear probe on frozen embeddings: a token the embeddings hold is found, random
labels are not."""

from kroberta.downstream.tasks import TaskSpec, read_labelled
from kroberta.pretraining import probe
from tests.downstream.tasks import marker_task


def _probe(model, tmp_path, random_labels):
    tmp_path.mkdir()
    train_path, validation_path = marker_task(tmp_path, random_labels=random_labels)
    spec = TaskSpec("marker")
    train, names = read_labelled(train_path, spec)
    validation, _ = read_labelled(validation_path, spec, names)
    return probe.linear_probe(model, spec, train, validation, names, max_length=16)


def test_a_probe_finds_a_token_in_mean_pooled_embeddings_and_not_random_labels(
    downstream_model, tmp_path
):
    # Even a random initialisation's mean-pooled states carry which tokens are present.
    assert _probe(downstream_model, tmp_path / "a", random_labels=False)["accuracy"] >= 0.9
    assert 0.3 <= _probe(downstream_model, tmp_path / "b", random_labels=True)["accuracy"] <= 0.7


def test_one_pass_scores_every_split_and_regression(downstream_model, tmp_path):
    train_path, validation_path = marker_task(tmp_path)
    spec = TaskSpec("marker", kind="regression", metric="pearson")
    train, _ = read_labelled(train_path, spec)
    validation, _ = read_labelled(validation_path, spec)
    task = probe.prepare_task(
        downstream_model.tokenizer,
        spec,
        None,
        {"train": train, "a": validation, "b": validation},
        16,
    )
    assert task.inputs["input_ids"].shape == (len(train) + 2 * len(validation), 16)
    scores = probe.scores(downstream_model, task)
    assert list(scores) == ["a", "b"] and scores["a"] == scores["b"]
    assert scores["a"]["pearson"] >= 0.8 and set(scores["a"]) == {"pearson", "spearman"}

"""The linear probe on frozen embeddings: a token the embeddings hold is found, random
labels are not."""

from tests.downstream.tasks import marker_task
from kroberta.downstream import probe
from kroberta.downstream.examples import TaskSpec, read_labelled


def _probe(model, tmp_path, random_labels):
    tmp_path.mkdir()
    train_path, validation_path = marker_task(tmp_path, random_labels=random_labels)
    spec = TaskSpec("marker")
    train, names = read_labelled(train_path, spec)
    validation, _ = read_labelled(validation_path, spec, names)
    return probe.linear_probe(model, spec, train, validation, names, max_length=16)


def test_a_probe_finds_a_token_in_mean_pooled_embeddings_and_not_random_labels(downstream_model, tmp_path):
    # Even a random initialisation's mean-pooled states carry which tokens are present.
    assert _probe(downstream_model, tmp_path / "a", random_labels=False)["accuracy"] >= 0.9
    assert 0.3 <= _probe(downstream_model, tmp_path / "b", random_labels=True)["accuracy"] <= 0.7

"""The embedded corpus leaves out the modules the embedded fine-tuning task validates on."""

import pytest

from kroberta.downstream import tasks
from kroberta.text import corpus


def _package(root, name, modules):
    (root / name).mkdir(parents=True)
    for i in range(modules):
        (root / name / f"m{i}.py").write_text(f'"""{name} module {i}."""\n')


@pytest.mark.fast
def test_every_fourth_module_of_a_task_package_is_held_out_of_the_corpus(tmp_path):
    root = tmp_path / "lib"
    _package(root, "email", 8)
    _package(root, "other", 3)  # not a task package: all of it is corpus
    held_out = corpus.held_out_files(str(root))
    assert sorted(held_out) == [str(root / "email" / "m1.py"), str(root / "email" / "m5.py")]
    stats = corpus.write_stdlib_corpus(tmp_path / "c.txt", root=str(root))
    written = (tmp_path / "c.txt").read_text().split("\n\n")[:-1]
    assert stats["held_out_files"] == 2 and stats["documents"] == 9
    assert "email module 1." not in written and "email module 5." not in written
    assert "email module 0." in written and "other module 2." in written
    # The task validates on exactly the held-out modules.
    train, validation = tasks._stdlib_package_splits(str(root), "email")
    assert validation == ["email module 1.", "email module 5."]
    assert set(train).isdisjoint(validation) and len(train) == 6


@pytest.mark.fast
def test_the_embedded_tasks_validation_texts_are_not_in_the_built_corpus(tmp_path):
    stats = corpus.write_stdlib_corpus(tmp_path / "c.txt")
    assert stats["held_out_files"] > 0
    documents = {" ".join(d.split()) for d in (tmp_path / "c.txt").read_text().split("\n\n")}
    _, validation, _ = tasks.stdlib_splits()
    held_out = corpus.held_out_files()
    # A validation text found in the corpus must come from a kept file too (a docstring
    # repeated word for word elsewhere, e.g. "Return self."), never from a held-out one.
    kept = {" ".join(d.split()) for d in corpus.stdlib_docstrings(exclude=held_out)}
    shared = set(validation.texts[0]) & documents
    assert shared <= kept
    assert len(shared) < 0.05 * len(validation.texts[0])

"""tools/suite_tasks.py, the downstream suite's tasks: no validation text is in the
pretraining corpus or the training set, and a neighbouring task's training texts are not
in the corpus either (checked on small fake sources, and on the standard library)."""

import argparse

import pytest

from tests.conftest import load_tool


def _suite_tasks():
    return load_tool("suite_tasks")


suite_tasks = _suite_tasks()
SHARED = "a description two packages share word word word"


def _words(unit: str, n: int) -> str:
    return " ".join(f"{unit}w{j}" for j in range(n))


def _fake_sources() -> dict:
    """Every source as a few hundred rows of unique words (so a text names its unit), and
    one description shared by a labelled package and a package of another section."""
    man = [
        (f"page{i}.1.gz", suite_tasks.common.SECTIONS_MAN[i % 6], _words(f"p{i}", 150))
        for i in range(300)
    ]
    sections = suite_tasks.common.SECTIONS_DEBIAN + ("libs", "devel")
    debian = [(f"pkg{i}", sections[i % 8], _words(f"d{i}", 12)) for i in range(800)]
    debian += [
        (f"shared{i}", section, SHARED)
        for i, section in enumerate(suite_tasks.common.SECTIONS_DEBIAN + ("libs",))
    ]
    library = [
        (f"{lib}/f{i}.py", lib, _words(f"{lib}{i}", 20))
        for lib in suite_tasks.LIBRARIES
        for i in range(60)
    ]
    stdlib = [
        (f"mod{i // 4}.py", ("module", "class", "function", "method")[i % 4], _words(f"s{i}", 20))
        for i in range(800)
    ]
    registry = [(f"{r}/n{i}", r, _words(f"{r}{i}", 8)) for r in ("pypi", "npm") for i in range(300)]
    changelog = [
        (
            f"src{i // 3}",
            ("new-upstream", "revision", "non-maintainer", "stable-update")[i % 4],
            _words(f"c{i}", 15),
        )
        for i in range(600)
    ]
    rows = {
        "man": man,
        "debian": debian,
        "library": library,
        "stdlib": stdlib,
        "registry": registry,
        "changelog": changelog,
    }
    return {name: (lambda r=r: r) for name, r in rows.items()}


def _assert_disjoint(task, unique_words=True):
    corpus_units = {unit for unit, _ in task.corpus}
    corpus_texts = {suite_tasks.text_hash(text) for _, text in task.corpus}
    train_units = {unit for unit, _, _ in task.train}
    train_texts = {suite_tasks.text_hash(text) for _, _, text in task.train}
    dev_units = {unit for unit, _, _ in task.dev}
    dev_texts = {suite_tasks.text_hash(text) for _, _, text in task.dev}
    assert task.train and task.dev and task.corpus, task.name
    assert not dev_units & (train_units | corpus_units), task.name
    assert not dev_texts & (train_texts | corpus_texts), task.name
    if unique_words:  # fake sources: no validation passage is a piece of a corpus text
        corpus_words = {w for _, text in task.corpus for w in text.split()}
        assert not any(set(text.split()) <= corpus_words for _, _, text in task.dev), task.name
    if task.own_text:
        assert train_units <= corpus_units, task.name
    else:
        assert not train_units & corpus_units, task.name
        assert not train_texts & corpus_texts, task.name


@pytest.mark.fast
def test_every_task_keeps_validation_out_of_training_and_corpus():
    tasks = suite_tasks.build_tasks(_fake_sources())
    assert [t.name for t in tasks] == [
        "man",
        "debian-other",
        "debian-few",
        "library",
        "docstring-kind",
        "registry",
        "changelog",
    ]
    for task in tasks:
        _assert_disjoint(task)
    by_name = {t.name: t for t in tasks}
    # The shared description is a corpus text (another section's package): never an example.
    assert all(
        text != SHARED
        for t in tasks
        for _, _, text in t.dev + t.train
        if t.name.startswith("debian")
    )
    # debian-*: the corpus holds only the other sections' packages.
    assert {unit for unit, _ in by_name["debian-other"].corpus} == {
        f"pkg{i}" for i in range(800) if i % 8 >= 6
    } | {"shared6"}
    assert {t.name for t in tasks if t.own_text} == {"man", "library"}
    assert {t.name for t in tasks if t.few_shot} == {"debian-few", "library", "changelog"}
    for task in tasks:
        counts = {}
        for _, label, _ in task.train:
            counts[label] = counts.get(label, 0) + 1
        assert max(counts.values()) <= (50 if task.few_shot else 120), (task.name, counts)


@pytest.mark.fast
def test_the_corpus_holds_each_unit_once_and_no_validation_text():
    tasks = suite_tasks.build_tasks(_fake_sources())
    documents = suite_tasks.corpus_documents(tasks, suite_tasks.random.Random(0))
    words = {w for doc in documents for w in doc.split()}
    for task in tasks:
        assert not any(set(text.split()) <= words for _, _, text in task.dev), task.name
    debian = tasks[1]
    assert sum(doc.count(SHARED) for doc in documents) == 1
    assert sum(doc.count(debian.corpus[0][1]) for doc in documents) == 1


@pytest.mark.fast
def test_a_leaking_task_is_refused():
    task = suite_tasks.build_tasks(_fake_sources(), only=["registry"])[0]
    task.corpus.append(task.dev[0][::2])  # (unit, text) of a validation example
    with pytest.raises(AssertionError, match="registry"):
        suite_tasks.check_disjoint(task)


@pytest.mark.fast
def test_a_source_with_no_rows_leaves_its_tasks_out():
    sources = dict(_fake_sources(), man=lambda: [], changelog=lambda: [])
    names = [t.name for t in suite_tasks.build_tasks(sources)]
    assert names == ["debian-other", "debian-few", "library", "docstring-kind", "registry"]


@pytest.mark.fast
@pytest.mark.parametrize(
    "version, kind",
    [
        ("2.3.1-1", "new-upstream"),
        ("2.3.1-4", "revision"),
        ("2.3.1-12", "revision"),
        ("2.3.1-1.1", "non-maintainer"),
        ("2.3.1-2+deb12u1", "stable-update"),
        ("2.3.1-1~deb12u1", "stable-update"),
        ("2.3.1", None),
        ("2.3.1-0experimental1", None),
    ],
)
def test_a_changelog_version_names_its_kind_of_change(version, kind):
    assert suite_tasks.changelog_kind(version) == kind


def test_the_standard_library_task_is_disjoint():
    """The real docstring-kind task (this interpreter's standard library, always here)."""
    sources = dict(suite_tasks.SOURCES)
    (task,) = suite_tasks.build_tasks(sources, only=["docstring-kind"])
    _assert_disjoint(task, unique_words=False)
    assert {label for _, label, _ in task.dev} == {"module", "class", "function", "method"}


def test_a_recipe_is_read_checked_and_named():
    bench_suite = load_tool("bench_suite")
    recipe = bench_suite.parse_recipe(["probe_epochs=2", "layer_decay=0.8"])
    assert recipe == {"probe_epochs": 2, "layer_decay": 0.8}
    assert bench_suite.recipe_label(recipe) == "layer_decay=0.8,probe_epochs=2"
    assert bench_suite.recipe_label({}) == ""
    with pytest.raises(SystemExit, match="--recipe adapt_step=3: expected NAME=VALUE"):
        bench_suite.parse_recipe(["adapt_step=3"])
    with pytest.raises(
        SystemExit, match=r"--recipe layer_decay=2.0: expected a factor in \(0, 1\]"
    ):
        bench_suite.parse_recipe(["layer_decay=2"])


def test_a_budget_is_steps_or_a_duration_named_and_ordered():
    bench_suite = load_tool("bench_suite")
    budgets = [bench_suite.budget_arg(text) for text in ("4", "15m", "1", "2h")]
    assert budgets == [4, "15m", 1, "2h"]
    assert [bench_suite.budget_name(b) for b in budgets] == ["4x", "15m", "1x", "2h"]
    assert sorted(budgets, key=bench_suite.budget_order) == [1, 4, "15m", "2h"]
    for wrong in ("0", "15q", "x"):
        with pytest.raises(
            argparse.ArgumentTypeError, match=f"a multiple of 1800 steps or a duration: '{wrong}'"
        ):
            bench_suite.budget_arg(wrong)

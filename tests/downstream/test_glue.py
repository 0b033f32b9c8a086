"""The GLUE readers on tiny files laid out as GLUE's own (headers, columns, stray quotes)."""

import pytest

from kroberta.downstream.tasks import glue_files, glue_spec, glue_tasks_present, read_labelled
from kroberta.errors import InputError

# folder -> (header or None, rows); each row's texts and label as GLUE's TSVs place them.
LAYOUTS = {
    "CoLA": (
        None,
        [
            ["gj04", "1", "", "The sailors rode the breeze clear of the rocks."],
            ["gj04", "0", "*", 'The more we study verbs, the crazier they get ".'],
        ],
    ),
    "SST-2": (["sentence", "label"], [['a "gripping" film ', "1"], ["dull", "0"]]),
    "MRPC": (
        ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
        [["1", "1", "2", 'He said "yes".', "He agreed."], ["0", "3", "4", "Rain.", "Sun."]],
    ),
    "STS-B": (
        [
            "index",
            "genre",
            "filename",
            "year",
            "old_index",
            "source1",
            "source2",
            "sentence1",
            "sentence2",
            "score",
        ],
        [
            [
                "0",
                "g",
                "f",
                "y",
                "0",
                "s",
                "s",
                "A plane takes off.",
                "An air plane is taking off.",
                "5.000",
            ],
            ["1", "g", "f", "y", "1", "s", "s", "A man plays.", "A cat sleeps.", "0.4"],
        ],
    ),
    "QQP": (
        ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
        [["0", "1", "2", 'Why "x"?', "Why x?", "1"], ["1", "3", "4", "How?", "Where?", "0"]],
    ),
    "MNLI": (
        [
            "index",
            "promptID",
            "pairID",
            "genre",
            "sentence1_binary_parse",
            "sentence2_binary_parse",
            "sentence1_parse",
            "sentence2_parse",
            "sentence1",
            "sentence2",
            "label1",
            "gold_label",
        ],
        [
            [
                "0",
                "1",
                "1n",
                "gov",
                "(",
                "(",
                "(",
                "(",
                "It rains.",
                "It is wet.",
                "entailment",
                "entailment",
            ],
            [
                "1",
                "2",
                "2c",
                "gov",
                "(",
                "(",
                "(",
                "(",
                "It rains.",
                "It is dry.",
                "contradiction",
                "contradiction",
            ],
        ],
    ),
    "QNLI": (
        ["index", "question", "sentence", "label"],
        [["0", "Who?", "Nobody.", "not_entailment"], ["1", "What?", "That.", "entailment"]],
    ),
    "RTE": (
        ["index", "sentence1", "sentence2", "label"],
        [["0", "A b.", "B a.", "entailment"], ["1", "C.", "D.", "not_entailment"]],
    ),
    "WNLI": (
        ["index", "sentence1", "sentence2", "label"],
        [["0", "I saw it.", "It saw me.", "0"], ["1", "He ran.", "He moved.", "1"]],
    ),
}
EXPECTED = {  # task -> (first example's texts, label ids, label names or None)
    "cola": (("The sailors rode the breeze clear of the rocks.",), [1, 0]),
    "sst2": (('a "gripping" film ',), [1, 0]),
    "mrpc": (('He said "yes".', "He agreed."), [1, 0]),
    "stsb": (("A plane takes off.", "An air plane is taking off."), [5.0, 0.4]),
    "qqp": (('Why "x"?', "Why x?"), [1, 0]),
    "mnli": (("It rains.", "It is wet."), [1, 0]),
    "qnli": (("Who?", "Nobody."), [1, 0]),
    "rte": (("A b.", "B a."), [0, 1]),
    "wnli": (("I saw it.", "It saw me."), [0, 1]),
}


def write_glue(root, folders=LAYOUTS):
    """A GLUE directory with train and dev files (MNLI: dev_matched, dev_mismatched)."""
    for folder, (header, rows) in folders.items():
        (root / folder).mkdir(parents=True)
        text = "".join("\t".join(r) + "\n" for r in ([header] if header else []) + rows)
        names = ["dev_matched.tsv", "dev_mismatched.tsv"] if folder == "MNLI" else ["dev.tsv"]
        for name in ["train.tsv"] + names:
            (root / folder / name).write_text(text)
    return root


@pytest.mark.parametrize("task", list(EXPECTED))
def test_each_task_reads_its_columns_and_labels(tmp_path, task):
    write_glue(tmp_path)
    spec = glue_spec(f"glue/{task}")
    train_path, evaluation = glue_files(f"glue/{task}", str(tmp_path))
    labelled, names = read_labelled(train_path, spec)
    texts, labels = EXPECTED[task]
    assert tuple(column[0] for column in labelled.texts) == texts
    assert labelled.labels.tolist() == pytest.approx(labels)
    assert len(labelled) == 2
    assert list(evaluation) == (["matched", "mismatched"] if task == "mnli" else ["dev"])
    for path in evaluation.values():
        assert read_labelled(path, spec, names)[0].labels.tolist() == pytest.approx(labels)


def test_the_task_folder_itself_may_be_given(tmp_path):
    write_glue(tmp_path)
    train_path, _ = glue_files("glue/rte", str(tmp_path / "RTE"))
    assert train_path == str(tmp_path / "RTE" / "train.tsv")


def test_tasks_present_in_glue_order_and_errors_name_what_is_missing(tmp_path):
    write_glue(tmp_path, {k: LAYOUTS[k] for k in ("RTE", "CoLA")})
    assert glue_tasks_present(str(tmp_path)) == ["cola", "rte"]
    with pytest.raises(InputError, match="glue/sst2 needs .*SST-2/train.tsv"):
        glue_files("glue/sst2", str(tmp_path))
    with pytest.raises(InputError, match="not a GLUE task .*glue/cola"):
        glue_spec("glue/squad")
    with pytest.raises(InputError, match="holds no GLUE task folder"):
        glue_tasks_present(str(tmp_path / "RTE"))


def test_a_label_outside_the_task_set_is_named(tmp_path):
    rows = [["0", "A.", "B.", "entailment"], ["1", "C.", "D.", "maybe"]]
    write_glue(tmp_path, {"RTE": (LAYOUTS["RTE"][0], rows)})
    train_path, _ = glue_files("glue/rte", str(tmp_path))
    with pytest.raises(
        InputError, match=r"train\.tsv: line 3: field 'label' holds the label 'maybe'"
    ):
        read_labelled(train_path, glue_spec("glue/rte"))

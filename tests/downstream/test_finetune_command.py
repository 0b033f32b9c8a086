"""`python -m kroberta.finetune`: one-line errors with exit code 2, and a whole run that
writes the result and a classifier whose predictions the command writes too."""

import json

import pytest

from kroberta.cli import finetune
from tests.downstream.tasks import marker_task


@pytest.mark.parametrize(
    "argv, message",
    [
        ([], "--run is required"),
        (["--run", "r", "--suite", "glue"], "--suite glue needs --data"),
        (["--classifier", "c"], "prediction needs --classifier, --predict and --predictions"),
        (["--run", "r", "--pooling", "max"], "--pooling: invalid choice: 'max'"),
    ],
)
def test_argument_errors_are_one_line_with_exit_code_2(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        finetune.main(argv)
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip()
    assert message in error and "\n" not in error


def test_bad_input_is_one_line_naming_it(capsys, tmp_path):
    assert finetune.main(["--run", str(tmp_path), "--task", "glue/squad", "--data", "x"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: ") and "config.toml is missing" in error and "\n" not in error
    texts = tmp_path.parent / f"{tmp_path.name}-texts.jsonl"  # beside: the folder stays empty
    texts.write_text('{"text": "a"}\n')
    assert (
        finetune.main(
            ["--classifier", str(tmp_path), "--predict", str(texts), "--predictions", "o.jsonl"]
        )
        == 2
    )
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: ") and "not a fine-tuned classifier" in error
    # A --predictions folder that does not exist is named before the classifier is loaded.
    assert (
        finetune.main(
            [
                "--classifier",
                str(tmp_path),
                "--predict",
                str(texts),
                "--predictions",
                str(tmp_path / "nodir" / "o.jsonl"),
            ]
        )
        == 2
    )
    error = capsys.readouterr().err.strip()
    assert (
        error == f"error: --predictions {tmp_path / 'nodir' / 'o.jsonl'}: no folder "
        f"{tmp_path / 'nodir'}"
    )


def test_a_run_writes_result_and_classifier_then_predicts(downstream_model, tmp_path, capsys):
    from kroberta.training import final_model

    run = tmp_path / "run"
    final_model.save(downstream_model, str(run))
    train, validation = marker_task(tmp_path, train=256, validation=64)
    out = tmp_path / "out"
    code = finetune.main(
        [
            "--run",
            str(run),
            "--data",
            train,
            "--validation",
            validation,
            "--learning-rates",
            "3e-3",
            "--seeds",
            "1",
            "--epochs",
            "3",
            "--max-length",
            "16",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "train.jsonl" in printed and "accuracy" in printed
    result = json.loads((out / "result.json").read_text())
    assert result["best_learning_rate"] == 3e-3 and len(result["trials"]) == 1
    predictions = tmp_path / "p.jsonl"
    assert (
        finetune.main(
            ["--classifier", str(out), "--predict", validation, "--predictions", str(predictions)]
        )
        == 0
    )
    rows = [json.loads(line) for line in predictions.read_text().splitlines()]
    labels = [json.loads(line)["label"] for line in open(validation)]
    assert len(rows) == 64 and set(rows[0]) == {"label", "probabilities"}
    # The probabilities are keyed by class name; the label is the likeliest of them.
    assert all(max(r["probabilities"], key=r["probabilities"].get) == str(r["label"]) for r in rows)
    agreement = sum(str(r["label"]) == str(y) for r, y in zip(rows, labels)) / len(rows)
    assert agreement == pytest.approx(result["median"]["validation"])
    # A file with labels is scored too: printed, and written beside the predictions.
    scored = json.loads((tmp_path / "p.metrics.json").read_text())
    assert scored["metrics"]["accuracy"] == pytest.approx(agreement)
    assert scored["per_class"]["1"]["support"] == sum(str(y) == "1" for y in labels)
    assert f"{validation}: accuracy {100 * agreement:.1f}" in capsys.readouterr().out
    # A file that names the text field otherwise: --text-field names it.
    renamed = tmp_path / "renamed.jsonl"
    renamed.write_text(
        "".join(
            json.dumps({"sentence": json.loads(line)["text"]}) + "\n" for line in open(validation)
        )
    )
    assert (
        finetune.main(
            [
                "--classifier",
                str(out),
                "--predict",
                str(renamed),
                "--text-field",
                "sentence",
                "--predictions",
                str(tmp_path / "q.jsonl"),
            ]
        )
        == 0
    )
    assert (tmp_path / "q.jsonl").read_text() == predictions.read_text()
    assert (
        finetune.main(
            [
                "--classifier",
                str(out),
                "--predict",
                str(renamed),
                "--text-field",
                "a",
                "--text-field",
                "b",
                "--predictions",
                str(tmp_path / "q.jsonl"),
            ]
        )
        == 2
    )
    assert (
        "--text-field: the classifier reads 1 text field(s) (text), got 2"
        in capsys.readouterr().err
    )
    # The masked-LM prediction command on the classifier names the command that predicts it.
    from kroberta.cli import predict

    assert (
        predict.main(["--run", str(out), "--data", validation, "--out", str(tmp_path / "p.npz")])
        == 2
    )
    assert (
        f"{out} is a fine-tuned classifier, not a masked LM; predict its labels with "
        f"python -m kroberta.finetune --classifier {out} --predict" in capsys.readouterr().err
    )


def test_a_glue_style_file_needs_no_text_field_and_both_starts_are_kept(
    downstream_model, tmp_path, capsys, monkeypatch
):
    from kroberta.text import recordfiles
    from kroberta.training import final_model

    read, iter_records = [], recordfiles.iter_records

    def counted(path, *args, **kwargs):
        read.append(path)
        return iter_records(path, *args, **kwargs)

    monkeypatch.setattr(recordfiles, "iter_records", counted)

    run = tmp_path / "run"
    final_model.save(downstream_model, str(run))
    paths = []
    for path in marker_task(tmp_path, train=128, validation=32):  # as a GLUE TSV: sentence, label
        records = [json.loads(line) for line in open(path)]
        tsv = tmp_path / path.replace(".jsonl", ".tsv")
        tsv.write_text(
            "sentence\tlabel\n" + "".join(f"{r['text']}\t{r['label']}\n" for r in records)
        )
        paths.append(str(tsv))
    out = tmp_path / "out"
    assert (
        finetune.main(
            [
                "--run",
                str(run),
                "--data",
                paths[0],
                "--validation",
                paths[1],
                "--learning-rates",
                "3e-3",
                "--seeds",
                "2",
                "--epochs",
                "1",
                "--max-length",
                "16",
                "--baseline",
                "--per-class",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert read == paths  # each file once: its header, the text field chosen, its records
    captured = capsys.readouterr()
    assert "no field 'text'; reading 'sentence' as the text" in captured.err
    lines = captured.out.splitlines()
    assert lines[0].startswith("train.tsv") and "(lr 0.003)" in lines[0]
    assert "classifier: lr 0.003 seed" in lines[1] and f"-> {out}" in lines[1]
    assert lines[2].startswith("random init") and f"-> {out / 'random-start'}" in lines[3]
    assert (
        "pretrained - random:" in lines[4]
        and "(bootstrap over the 32 validation examples)" in lines[4]
    )
    assert lines[5].split() == ["validation", "precision", "recall", "f1", "support"]
    result = json.loads((out / "result.json").read_text())
    assert result["kept"]["seed"] in (0, 1) and result["baseline"]["kept"]["learning_rate"] == 3e-3
    assert set(result["per_class"]["validation"]) == {"0", "1"}
    assert result["comparison"]["low"] <= result["comparison"]["high"]
    # The random start's classifier is a classifier of its own, which predicts.
    assert (
        finetune.main(
            [
                "--classifier",
                str(out / "random-start"),
                "--predict",
                paths[1],
                "--predictions",
                str(tmp_path / "r.jsonl"),
            ]
        )
        == 0
    )
    assert len((tmp_path / "r.jsonl").read_text().splitlines()) == 32


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--learning-rates", "3e4"], "--learning-rates 30000: outside 1e-08 to 1"),
        (["--baseline-learning-rates", "0"], "--baseline-learning-rates 0: outside"),
        (["--early-stopping", "0"], "--early-stopping 0: expected a patience of at least 1"),
    ],
)
def test_fine_tuning_settings_out_of_range_are_one_line(
    downstream_model, tmp_path, capsys, argv, message
):
    from kroberta.training import final_model

    run = tmp_path / "run"
    final_model.save(downstream_model, str(run))
    train, validation = marker_task(tmp_path, train=16, validation=8)
    assert (
        finetune.main(["--run", str(run), "--data", train, "--validation", validation, *argv]) == 2
    )
    error = capsys.readouterr().err.strip()
    assert message in error and "\n" not in error


@pytest.mark.slow
def test_the_glue_suite_prints_a_row_per_task_and_the_average(downstream_model, tmp_path, capsys):
    from test_glue import LAYOUTS, write_glue

    from kroberta.training import final_model

    run = tmp_path / "run"
    final_model.save(downstream_model, str(run))
    glue_dir = write_glue(tmp_path / "glue", {k: LAYOUTS[k] for k in ("CoLA", "STS-B", "MNLI")})
    out = tmp_path / "out"
    assert (
        finetune.main(
            [
                "--run",
                str(run),
                "--suite",
                "glue",
                "--data",
                str(glue_dir),
                "--learning-rates",
                "1e-3",
                "--seeds",
                "2",
                "--epochs",
                "1",
                "--batch-size",
                "4",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    # A row per task (each followed by an indented line naming the classifier it kept).
    rows = [line for line in lines if line and not line.startswith(" ")]
    assert [row.split()[0] for row in rows] == ["glue/cola", "glue/stsb", "glue/mnli", "average"]
    kept = [line.split()[0] for line in lines if line.startswith(" ")]
    assert kept == ["classifier:"] * 3
    assert "matthews" in rows[0] and "pearson" in rows[1] and "matched" in rows[2]
    assert "mismatched" in rows[2]
    for task in ("cola", "stsb", "mnli"):
        result = json.loads((out / task / "result.json").read_text())
        assert len(result["trials"]) == 2 and (out / task / "classifier.weights.h5").is_file()


@pytest.mark.fast
def test_result_json_leaves_the_classifier_alone():
    # dataclasses.asdict deep-copies every field: for a Keras model that is a save and a
    # reload of the whole classifier (and Keras' warnings about its optimizer).
    from kroberta.downstream.results import FinetuneResult, Trial

    class NoCopy:
        def __deepcopy__(self, memo):
            raise AssertionError("the classifier was copied")

    trial = Trial(1e-3, 0, {"validation": {"accuracy": 0.5}}, 1.0)
    result = FinetuneResult(
        "t",
        "accuracy",
        "validation",
        ("a", "b"),
        [trial],
        1e-3,
        {"validation": 0.5},
        {"validation": 0.5},
        {"validation": 0.5},
        classifier=NoCopy(),
    )
    result.baseline = FinetuneResult(
        "t",
        "accuracy",
        "validation",
        ("a", "b"),
        [trial],
        1e-3,
        {"validation": 0.4},
        {"validation": 0.4},
        {"validation": 0.4},
        classifier=NoCopy(),
    )
    data = json.loads(json.dumps(result.to_json()))
    assert data["trials"] == [
        {
            "learning_rate": 1e-3,
            "seed": 0,
            "seconds": 1.0,
            "scores": {"validation": {"accuracy": 0.5}},
            "best_epoch": None,
            "epochs_run": None,
            "diverged": None,
        }
    ]
    assert data["label_names"] == ["a", "b"] and data["baseline"]["median"] == {"validation": 0.4}
    assert "classifier" not in data and "classifier" not in data["baseline"]


@pytest.mark.fast
def test_predictions_never_replace_the_input_or_the_classifier_s_files(tmp_path):
    import argparse

    from kroberta.cli import finetune_predict
    from kroberta.errors import InputError

    folder = tmp_path / "ft"
    folder.mkdir()
    (folder / "result.json").write_text('{"task": "t"}')
    (folder / "x.metrics.json").write_text("{}")
    texts = tmp_path / "texts.jsonl"
    texts.write_text('{"text": "a"}\n')

    def refusal(predictions):
        args = argparse.Namespace(
            classifier=str(folder), predict=str(texts), predictions=str(predictions)
        )
        with pytest.raises(InputError) as refused:
            finetune_predict.check(args)
        return str(refused.value)

    assert refusal(folder / "result.json") == (
        f"--predictions {folder / 'result.json'}: would replace {folder / 'result.json'}, a "
        f"file of the classifier's folder {folder}; write the predictions elsewhere"
    )
    assert refusal(folder / "x.jsonl").startswith(  # its metrics file would land on one
        f"--predictions {folder / 'x.jsonl'}: would replace {folder / 'x.metrics.json'}, "
    )
    assert refusal(texts) == (
        f"--predictions {texts}: would replace the --predict file {texts}; give another file"
    )
    assert (folder / "result.json").read_text() == '{"task": "t"}'
    assert texts.read_text() == '{"text": "a"}\n'

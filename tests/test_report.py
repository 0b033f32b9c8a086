import json

import pytest

import kroberta.cli.report
from kroberta import report, train
from kroberta.perf import throughput
from kroberta.training.report import PANELS
from tests.conftest import tiny_config


def _write_rows(run_dir):
    rows = []
    for step in range(10, 210, 10):
        rows.append(
            {
                "step": step,
                "split": "train",
                "loss": 6.0 - step / 50,
                "masked_accuracy": step / 400,
                "learning_rate": 1e-3 * (1 - step / 200),
                "samples_per_second": 60.0 + step % 7,
                "tokens_per_second": 3840.0 + step,
                "step_time": 1.0,
                "mfu": 0.2 + step / 2000,
                **({"compile_seconds": 12.5} if step == 10 else {}),
            }
        )
        if step % 100 == 0:
            rows.append(
                {
                    "step": step,
                    "split": "validation",
                    "loss": 5.5 - step / 100,
                    "masked_accuracy": step / 300,
                    "perplexity": 1.0,
                }
            )
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _assert_real_png(path):
    import matplotlib.image

    assert path.stat().st_size > 20_000
    image = matplotlib.image.imread(str(path))
    assert image.shape[0] > 600 and image.shape[1] > 500
    assert image[..., :3].std() > 0.05  # curves, text and axes; not a blank canvas


@pytest.mark.fast
def test_report_draws_a_png_and_summarizes(tmp_path, caplog):
    _write_rows(tmp_path)
    with caplog.at_level("INFO", logger="kroberta"):
        summary = report(str(tmp_path))
    _assert_real_png(tmp_path / "report.png")
    assert summary["steps"] == 200
    assert summary["best_validation_loss"] == pytest.approx(3.5)
    assert summary["final_validation_accuracy"] == pytest.approx(200 / 300)
    assert summary["median_tokens_per_second"] == pytest.approx(3945.0)
    assert summary["compile_seconds"] == 12.5
    out = caplog.text
    assert "best loss 3.5" in out and "MFU" in out and "compile 12.5 s" in out
    assert "steps: 200   final" in out  # no config.toml: nothing says how many were planned
    # A run stopped early (--until-step, Ctrl-C) says so against its config's train.steps.
    from kroberta.config import Config, to_toml

    (tmp_path / "config.toml").write_text(to_toml(Config()))
    caplog.clear()
    with caplog.at_level("INFO", logger="kroberta"):
        assert report(str(tmp_path))["planned_steps"] == Config().train.steps
    assert f"steps: 200 of {Config().train.steps} (unfinished)   final" in caplog.text
    (tmp_path / "model.weights.h5").write_bytes(b"")  # ended: stopped early, not unfinished
    caplog.clear()
    with caplog.at_level("INFO", logger="kroberta"):
        report(str(tmp_path))
    assert f"steps: 200 of {Config().train.steps} (stopped early)   final" in caplog.text


@pytest.mark.fast
def test_the_report_command_prints_its_summary_on_stdout(tmp_path, capsys):
    _write_rows(tmp_path)
    assert kroberta.cli.report.main([str(tmp_path)]) == 0
    printed = capsys.readouterr()
    assert "best loss 3.5" in printed.out and "curves:" in printed.out  # > summary.txt keeps it
    assert "best loss" not in printed.err


@pytest.mark.fast
def test_a_reader_that_left_gets_no_logging_tracebacks(tmp_path, capsys, monkeypatch):
    # `python -m kroberta.report RUN | head -1`: every line after the first met a closed pipe.
    class Closed:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            pass

    _write_rows(tmp_path)
    monkeypatch.setattr("sys.stdout", Closed())
    assert kroberta.cli.report.main([str(tmp_path)]) == 0
    monkeypatch.undo()
    assert "Logging error" not in capsys.readouterr().err


@pytest.mark.fast
def test_report_without_metrics_is_a_clear_error(tmp_path, capsys):
    assert kroberta.cli.report.main([str(tmp_path)]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err
    assert kroberta.cli.report.main([str(tmp_path / "missing")]) == 2
    assert "no such directory" in capsys.readouterr().err
    (tmp_path / "metrics.jsonl").write_text("")
    assert kroberta.cli.report.main([str(tmp_path / "metrics.jsonl")]) == 2
    assert capsys.readouterr().err == (
        f"error: {tmp_path / 'metrics.jsonl'}: a file, not a run "
        f"directory; give the directory that holds it ({tmp_path})\n"
    )


def test_a_real_run_logs_step_time_and_mfu_and_reports(tiny_data, tmp_path, monkeypatch):
    monkeypatch.setattr(throughput, "cpu_peak_flops", lambda refresh=False: 1e11)
    config = tiny_config(
        tiny_data, tmp_path, steps=20, log_every=10, eval_every=20, checkpoint_every=20
    )
    train(config)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    timed = [r for r in rows if r["split"] == "train" and "samples_per_second" in r]
    assert timed
    for r in timed:
        assert r["step_time"] == pytest.approx(16 / r["samples_per_second"])
        assert 0 < r["mfu"] < 1  # the tiny model is nowhere near the (mocked) peak
    summary = report(str(tmp_path))
    _assert_real_png(tmp_path / "report.png")
    assert summary["steps"] == 20 and "median_mfu" in summary


def test_a_cpu_peak_below_the_run_s_rate_is_measured_again_once(
    tiny_data, tmp_path, monkeypatch, caplog
):
    """A peak cached while the machine was busy gave MFU above 100%."""
    calls = []

    def peak(refresh=False, at_least=0.0):
        calls.append((refresh, at_least))
        return max(1e3, at_least) if refresh else 1.0  # the cached figure: far too low

    monkeypatch.setattr(throughput, "cpu_peak_flops", peak)
    config = tiny_config(
        tiny_data, tmp_path, steps=30, log_every=10, eval_every=30, checkpoint_every=30
    )
    train(config)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    timed = [r for r in rows if r["split"] == "train" and "mfu" in r]
    assert len(timed) >= 2 and all(0 < r["mfu"] <= 1 for r in timed)
    again = [at_least for refresh, at_least in calls if refresh]
    assert len(again) == 1 and again[0] > 1e3  # once, at least the rate the run did
    assert sum("the CPU's peak was measured again" in m for m in caplog.messages) == 1


@pytest.mark.fast
def test_report_returns_the_figure_and_leaves_pyplot_alone(tmp_path):
    import matplotlib
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    _write_rows(tmp_path)
    backend = matplotlib.get_backend()
    open_before = plt.get_fignums()
    summary = report(str(tmp_path), show=False)
    assert isinstance(summary["figure"], Figure)
    labels = [ax.get_ylabel() for ax in summary["figure"].axes]
    assert labels == [label for _, label in PANELS]
    assert matplotlib.get_backend() == backend  # a notebook's inline backend stays
    assert plt.get_fignums() == open_before


@pytest.mark.fast
def test_report_shows_grad_norm_and_marks_the_best_checkpoint(tmp_path, caplog):
    _write_rows(tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        if row["split"] == "train":
            row["grad_norm"] = 0.5 + row["step"] / 100
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # Kept checkpoints at 100 (validation loss 4.5) and 200 (3.5, the best).
    for step in (100, 200):
        path = tmp_path / "checkpoints" / f"step_{step:08d}"
        path.mkdir(parents=True)
        (path / "_CHECKPOINT_METADATA").write_text("{}")
    with caplog.at_level("INFO", logger="kroberta"):
        summary = report(str(tmp_path))
    assert summary["best_checkpoint_step"] == 200 and summary["max_grad_norm"] == 2.5
    assert len(summary["figure"].axes) == len(PANELS) + 1  # the grad_norm panel
    out = caplog.text
    assert "best checkpoint: step 200 (validation loss 3.5)" in out
    assert "grad_norm: final 2.5, median 1.55, max 2.5" in out


def _write_probe_rows(run_dir, probe_values, reference=0.40, noise=0.03, steps=(50, 100, 150, 200)):
    """Probe rows as training writes them: each with its difference to the random line
    and that difference's interval, +-`noise` around it."""
    _write_rows(run_dir)
    rows = [
        {
            "step": steps[0],
            "split": "downstream/stdlib/random_init",
            "accuracy": reference,
            "f1": 0.1,
            "seconds": 0.5,
        }
    ]
    rows += [
        {
            "step": step,
            "split": "downstream/stdlib",
            "accuracy": value,
            "f1": 0.2,
            "vs_random_init": value - reference,
            "vs_random_init_low": value - reference - noise,
            "vs_random_init_high": value - reference + noise,
            "seconds": 0.5,
        }
        for step, value in zip(steps, probe_values)
    ]
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


@pytest.mark.fast
def test_report_names_the_first_checkpoint_whose_probe_clears_the_noise(tmp_path, caplog):
    # Above the line is not enough: step 100 beats it by 0.02, inside the noise of 0.03;
    # 150 is the first beyond it (200 dips again: the first step is named, with the best).
    _write_probe_rows(tmp_path, (0.30, 0.42, 0.45, 0.39))
    with caplog.at_level("INFO", logger="kroberta"):
        summary = report(str(tmp_path))
    verdict = summary["probe"]["downstream/stdlib"]
    assert verdict["pays_from_step"] == 150 and verdict["random_init"] == 0.40
    assert (verdict["best_step"], verdict["best"]) == (150, 0.45)
    assert verdict["metric"] == "accuracy"  # the task's first metric
    assert verdict["gaps"][150] == pytest.approx((0.05, 0.02, 0.08))
    assert (
        "probe stdlib: pretraining pays from step 150 (accuracy 0.45 vs 0.4, +0.05 [+0.02, "
        "+0.08]: beyond the noise of a 95% bootstrap over the validation texts; best 0.45 at "
        "step 150)"
    ) in caplog.messages
    # The probe's panel: the pretrained curve, the random initialisation's line and the
    # noise's band around it (from each checkpoint's interval).
    figure = summary["figure"]
    assert len(figure.axes) == len(PANELS) + 1
    probe_axis = figure.axes[-1]
    assert probe_axis.get_ylabel() == "probe accuracy"
    labels = [line.get_label() for line in probe_axis.lines]
    assert labels == ["stdlib: pretrained", "stdlib: random initialisation"]
    assert list(probe_axis.lines[0].get_ydata()) == [0.30, 0.42, 0.45, 0.39]
    assert list(probe_axis.lines[1].get_ydata()) == [0.40, 0.40]
    bands = [c for c in probe_axis.collections if c.get_label().startswith("stdlib: noise")]
    assert len(bands) == 1
    low, high = (
        bands[0].get_paths()[0].vertices[:, 1].min(),
        bands[0].get_paths()[0].vertices[:, 1].max(),
    )
    assert (low, high) == pytest.approx((0.37, 0.43))  # the line -+ the noise
    assert (tmp_path / "report.png").stat().st_size > 0


@pytest.mark.fast
def test_a_probe_above_the_line_by_less_than_its_noise_does_not_pay_yet(tmp_path, caplog):
    # +0.3 points on 600 texts: the interval of the difference holds 0.
    _write_probe_rows(
        tmp_path, (0.3301, 0.3417, 0.3392), reference=0.3383, noise=0.038, steps=(300, 900, 1800)
    )
    with caplog.at_level("INFO", logger="kroberta"):
        summary = report(str(tmp_path))
    assert summary["probe"]["downstream/stdlib"]["pays_from_step"] is None
    assert (
        "probe stdlib: not yet beyond the noise (best: step 900, accuracy 0.3417 vs 0.3383, "
        "+0.0034 [-0.0346, +0.0414]; a 95% bootstrap over the validation texts)"
    ) in caplog.messages


@pytest.mark.fast
def test_report_says_when_pretraining_does_not_pay_yet(tmp_path, caplog):
    _write_probe_rows(tmp_path, (0.30, 0.35, 0.38, 0.40))
    with caplog.at_level("INFO", logger="kroberta"):
        summary = report(str(tmp_path))
    assert summary["probe"]["downstream/stdlib"]["pays_from_step"] is None
    assert (
        "probe stdlib: not yet beyond the noise (best: step 200, accuracy 0.4 vs 0.4, +0 "
        "[-0.03, +0.03]; a 95% bootstrap over the validation texts)"
    ) in caplog.messages

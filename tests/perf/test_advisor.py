import pytest

import kroberta.cli.train
from kroberta.config import apply_overrides, config_path, load_toml, validate
from kroberta.perf import advisor, flops


def _seed():
    return load_toml(config_path("seed"))


@pytest.mark.fast
def test_seed_shape_is_flagged_with_costs():
    found = {m.key: m for m in advisor.misalignments(flops.Shape.from_config(_seed()))}
    assert set(found) == {"hidden_dim", "head_dim", "intermediate_dim", "vocabulary_size"}
    assert (
        found["hidden_dim"].value,
        found["head_dim"].value,
        found["intermediate_dim"].value,
        found["vocabulary_size"].value,
    ) == (300, 50, 600, 10000)
    assert all(0 < m.waste < 1 for m in found.values())
    assert found["hidden_dim"].waste > found["vocabulary_size"].waste  # 300->384 costs most
    assert "pad it to 384" in found["hidden_dim"].describe()


@pytest.mark.fast
def test_suggestion_is_aligned_and_nearby():
    seed = _seed()
    s = advisor.suggest(seed.model)
    assert (s.hidden_dim, s.num_heads, s.head_dim, s.intermediate_dim, s.vocabulary_size) == (
        384,
        6,
        64,
        640,
        10112,
    )
    suggested = validate(
        apply_overrides(
            seed,
            [
                f"model.hidden_dim={s.hidden_dim}",
                f"model.num_heads={s.num_heads}",
                f"model.intermediate_dim={s.intermediate_dim}",
                f"model.vocabulary_size={s.vocabulary_size}",
            ],
        )
    )
    assert advisor.misalignments(flops.Shape.from_config(suggested)) == []
    lines = advisor.warnings_for(seed)
    assert len(lines) == 5 and "--model.hidden_dim=384 --model.num_heads=6" in lines[-1]
    assert any("mixed_precision" in line for line in advisor.warnings_for(seed, "tpu"))


def test_explain_exits_0_without_creating_a_run_dir(tmp_path, capsys):
    run_dir = tmp_path / "never"
    code = kroberta.cli.train.main(["--explain", "--config", "tiny", f"--run_dir={run_dir}"])
    out = capsys.readouterr().out
    assert code == 0
    assert not run_dir.exists()
    assert "36,192 parameters" in out
    assert "FLOPs per token" in out and "memory per device (estimate)" in out
    assert "memory per device (XLA" in out  # the compiled train step's memory analysis
    assert "warning: model.hidden_dim = 32 is not a multiple of 128" in out


@pytest.mark.fast
def test_explain_reports_bad_config_as_error(capsys):
    code = kroberta.cli.train.main(["--explain", "--model.num_heads=7"])
    assert code == 2
    assert "model.num_heads" in capsys.readouterr().err

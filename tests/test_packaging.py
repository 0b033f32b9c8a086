"""The package as pip installs it: a wheel built from the repository ships the named
configs, and a fresh virtual environment with that wheel resolves `--config seed`."""

import os
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile

import pytest

from tests.conftest import REPO


def _build_wheel(tmp_path) -> str:
    # Built from a copy: setuptools writes build/ and *.egg-info next to the sources.
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(REPO, name), source / name)
    shutil.copytree(
        os.path.join(REPO, "kroberta"),
        source / "kroberta",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    # Offline: no build isolation (it would download setuptools), no dependencies.
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            str(source),
            "-w",
            str(tmp_path / "dist"),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("kroberta-*.whl")
    return str(wheel)


def test_the_wheel_ships_the_configs(tmp_path):
    wheel = _build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        shipped = sorted(n for n in names if n.startswith("kroberta/configs/"))
        assert shipped == [
            "kroberta/configs/base.toml",
            "kroberta/configs/seed.toml",
            "kroberta/configs/small.toml",
            "kroberta/configs/tiny.toml",
        ]
        for name in shipped:
            with open(os.path.join(REPO, name), "rb") as f:
                assert archive.read(name) == f.read()
    assert "kroberta/config.py" in names


@pytest.mark.slow
def test_a_fresh_venv_with_the_wheel_resolves_named_configs(tmp_path):
    wheel = _build_wheel(tmp_path)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    # Without PYTHONPATH: a checkout on it (with its kroberta.egg-info) reads to pip as kroberta
    # installed already, and the wheel would be skipped.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KERAS_BACKEND")}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            python,
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            wheel,
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # The dependencies (keras, jax, tensorflow, ...) come from this environment, added
    # after the venv's own site-packages as a plain path: its editable kroberta is not.
    venv_site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ours = (
        sysconfig.get_path("purelib")
        if sys.prefix != sys.base_prefix
        else site.getsitepackages()[0]
    )
    with open(os.path.join(venv_site, "dependencies.pth"), "w") as f:
        f.write(ours + "\n")
    work = tmp_path / "elsewhere"  # no configs/ folder and no repository on the path
    work.mkdir()

    def run(*args):
        return subprocess.run(
            [python, *args], capture_output=True, text=True, cwd=work, env=env, timeout=600
        )

    found = run(
        "-c",
        "import kroberta; c = kroberta.load_config('seed'); "
        "print(kroberta.__file__); print(c.model.hidden_dim)",
    )
    assert found.returncode == 0, found.stderr[-3000:]
    location, hidden = found.stdout.split()[-2:]
    assert location == os.path.join(venv_site, "kroberta", "__init__.py") and hidden == "300"

    # The CLI finds `--config seed` too: the seed's hidden_dim=300 is in the message.
    cli = run("-m", "kroberta.train", "--config", "seed", "--model.num_heads=7")
    assert cli.returncode == 2
    assert cli.stderr.strip().splitlines()[-1] == (
        "error: command line: model.num_heads: 7 heads do not divide hidden_dim=300"
    )
    unknown = run("-m", "kroberta.train", "--config", "sead")
    assert unknown.returncode == 2
    assert unknown.stderr.strip().splitlines()[-1] == (
        "error: config 'sead': neither a shipped config (base, seed, small, tiny) nor a file; give one "
        "of those names, the path of a TOML file or a run directory"
    )
    assert not (work / "runs").exists()

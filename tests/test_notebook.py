"""A real Jupyter kernel runs a small notebook the way a Colab user writes one:
tensorflow first, then kroberta, a tiny training from a named config on data the
notebook writes, predict, fill_mask and the report."""

import os

import pytest

from tests.conftest import REPO

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

CELLS = [
    # 0: the usual first line; TensorFlow imports Keras on its default backend here.
    "import tensorflow as tf\n"
    "import kroberta\n"
    "import keras\n"
    "print('backend', keras.backend.backend())",
    # 1: data the notebook writes itself, prepared into a tokenizer and TFRecords.
    "import random\n"
    "from kroberta import prepare\n"
    "from kroberta.data.manifest import load_manifest\n"
    "rng = random.Random(0)\n"
    "words = ['alpha', 'beta', 'gamma', 'delta', 'omega', 'river', 'stone', 'cloud']\n"
    "with open('corpus.txt', 'w') as f:\n"
    "    for _ in range(300):\n"
    "        words_8 = ' '.join(rng.choice(words) for _ in range(8))\n"
    "        f.write('The ' + words_8 + ' ends here.\\n\\n')\n"
    "prepare(['corpus.txt'], 'data', vocab_size=300, seq_len=32,\n"
    "                validation_fraction=0.1, progress=False)\n"
    "manifest = load_manifest('data')\n"
    "print('vocabulary', manifest.vocabulary_size)",
    # 2: a tiny training from a named config.
    "config = kroberta.load_config('tiny', {'data.dir': 'data', 'run_dir': 'run',\n"
    "    'model.vocabulary_size': manifest.vocabulary_size, 'model.num_layers': 1,\n"
    "    'train.steps': 20, 'train.warmup_steps': 5, 'train.log_every': 5,\n"
    "    'train.eval_every': 10, 'train.checkpoint_every': 10})\n"
    "summary = kroberta.train(config)\n"
    "print('final_step', summary['final_step'])",
    # 3: predict and fill_mask with the trained model.
    "model = kroberta.load('run')\n"
    "out = kroberta.predict(model, list(manifest.validation_files), output='top_k', k=3)\n"
    "print('top_k', out['token_ids'].shape[0] == manifest.validation_sequences,\n"
    "      out['token_ids'].shape[2])\n"
    "filled = kroberta.fill_mask(model, ['The alpha <mask> gamma ends here.'], top_k=3)\n"
    "print('fill_mask', len(filled[0]), sorted(filled[0][0]))",
    # 4: the report, inline.
    "report = kroberta.report('run')\nprint('figure', type(report['figure']).__name__)",
]


def _text(output):
    if output["output_type"] == "stream":
        return output["text"]
    return output.get("data", {}).get("text/plain", "")


def test_a_notebook_trains_predicts_and_reports(tmp_path):
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    env = {k: v for k, v in os.environ.items() if k not in ("KERAS_BACKEND", "XLA_FLAGS")}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    client = nbclient.NotebookClient(
        notebook,
        timeout=900,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute(env=env)
    outputs = [cell["outputs"] for cell in notebook.cells]
    for i, cell_outputs in enumerate(outputs):
        assert not [o for o in cell_outputs if o["output_type"] == "error"], (i, cell_outputs)
    stdout = [
        "".join(o["text"] for o in cell if o["output_type"] == "stream" and o["name"] == "stdout")
        for cell in outputs
    ]

    assert "backend jax\n" in stdout[0]
    assert "vocabulary " in stdout[1]
    # No start-up noise from the libraries underneath (TensorFlow's absl, oneDNN and CUDA
    # lines are native stderr, which the kernel does not capture; Python warnings are).
    stderr = "".join(
        o["text"]
        for cell in outputs
        for o in cell
        if o["output_type"] == "stream" and o["name"] == "stderr"
    )
    for noise in ("TqdmWarning", "IProgress", "oneDNN", "cudart", "absl::InitializeLog"):
        assert noise not in stderr, stderr[-2000:]

    # Training: one progress display updated in place, not a line per interval.
    displays = [o for o in outputs[2] if o["output_type"] == "display_data"]
    assert len(displays) == 1
    bar = displays[0]["data"]
    assert bar["text/plain"].startswith("step 20/20 [" + "=" * 30 + "] 100%  loss ")
    assert "<progress value='20' max='20'" in bar["text/html"]
    assert "[train]" not in stdout[2]  # the bar replaced the per-interval lines
    assert stdout[2].count("[validation]") == 2  # evaluations at steps 10 and 20
    assert "final_step 20\n" in stdout[2]

    assert "top_k True 3\n" in stdout[3]
    assert "fill_mask 3 ['score', 'sequence', 'token', 'token_id', 'token_str']\n" in stdout[3]

    # The report: its picture inline, its summary printed.
    images = [
        o for o in outputs[4] if o["output_type"] == "display_data" and "image/png" in o["data"]
    ]
    assert len(images) == 1 and len(images[0]["data"]["image/png"]) > 10_000
    assert "final train loss" in stdout[4] and "figure Figure\n" in stdout[4]
    assert (tmp_path / "run" / "report.png").exists()

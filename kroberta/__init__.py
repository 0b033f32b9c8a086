"""kroberta: pretrain RoBERTa masked-language models on Keras 3 + JAX.

Importing kroberta puts Keras on JAX (before keras is imported, or by reloading a
Keras that tensorflow/keras/keras_hub imported first but nothing used yet; see
`kroberta.runtime.backend`) and confines TensorFlow to the CPU before it can touch an accelerator.
"""

import importlib
import sys

from kroberta.errors import BackendError
from kroberta.runtime import backend, quiet_start, xla_cpu

# Before anything starts JAX's backends: XLA reads XLA_FLAGS once per process.
xla_cpu.use_eigen_dots()
xla_cpu.use_patient_collectives()

quiet_start.ignore_tqdm_notebook_notice()

try:
    backend.select_jax_backend()
    backend.hide_accelerators_from_tensorflow()
except BackendError as _error:
    if sys.argv and sys.argv[0] == "-m":
        # `python -m kroberta.<tool>`: Python is importing this package to find the
        # tool, so there is no caller to hand the exception to; say it in one line.
        print(f"error: {_error}", file=sys.stderr)
        sys.exit(2)
    raise

__version__ = "0.1.0"


# The public API, loaded lazily so `import kroberta` stays cheap for tools that only
# need the config or the data pipeline: name -> the module that defines it.
_API = {
    "MaskedLM": "kroberta.model.masked_lm",
    "load": "kroberta.downstream.model_files",
    "save": "kroberta.training.final_model",
    "predict": "kroberta.inference.prediction",
    "predict_batches": "kroberta.inference.prediction",
    "fill_mask": "kroberta.inference.filling",
    "evaluate": "kroberta.training.evaluation",
    "dataset": "kroberta.training.run_data",
    "export_hf": "kroberta.interop.hf",
    "export_keras_hub": "kroberta.interop.keras_hub_presets",
    "load_config": "kroberta.config",
    "prepare": "kroberta.text.build",
    "train": "kroberta.pretraining.train",
    "report": "kroberta.training.report",
    "finetune": "kroberta.downstream.finetuning",
    "FinetuneConfig": "kroberta.downstream.settings",
}


def __getattr__(name):
    if name not in _API:
        raise AttributeError(f"module 'kroberta' has no attribute {name!r}")
    return getattr(importlib.import_module(_API[name]), name)


__all__ = list(_API)

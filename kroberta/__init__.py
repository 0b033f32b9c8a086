"""kroberta: pretrain RoBERTa masked-language models on Keras 3 + JAX.

Importing kroberta puts Keras on JAX (before keras is imported, or by reloading a
Keras that tensorflow/keras/keras_hub imported first but nothing used yet; see
`_backend`) and confines TensorFlow to the CPU before it can touch an accelerator.
"""

import sys

from kroberta.runtime import backend as _backend, cpu_collectives, quiet_start, xla_cpu

# Before anything starts JAX's backends: XLA reads XLA_FLAGS once per process.
xla_cpu.use_eigen_dots()
cpu_collectives.use_patient_collectives()

quiet_start.ignore_tqdm_notebook_notice()

try:
    _backend.select_jax_backend()
    _backend.hide_accelerators_from_tensorflow()
except _backend.BackendError as _error:
    if sys.argv and sys.argv[0] == "-m":
        # `python -m kroberta.<tool>`: Python is importing this package to find the
        # tool, so there is no caller to hand the exception to; say it in one line.
        print(f"error: {_error}", file=sys.stderr)
        sys.exit(2)
    raise

__version__ = "0.1.0"


def __getattr__(name):
    # The public API is loaded lazily so `import kroberta` stays cheap for tools
    # that only need the config or the data pipeline.
    if name in ("load", "save"):
        from kroberta.training import saving as checkpoint_io

        return getattr(checkpoint_io, name)
    if name in ("predict", "predict_batches"):
        from kroberta.inference import engine as prediction

        return getattr(prediction, name)
    if name == "fill_mask":
        from kroberta.inference.filling import fill_mask

        return fill_mask
    if name == "dataset":
        from kroberta.training.run_data import dataset

        return dataset
    if name in ("export_hf", "from_hf"):
        from kroberta.interop import hf

        return getattr(hf, name)
    if name == "load_config":
        from kroberta.config import load_config

        return load_config
    if name in ("train", "report"):
        # The modules themselves (`kroberta.train.main(config)`,
        # `kroberta.report.report(run_dir)`), without a separate `import kroberta.train`.
        import importlib

        return importlib.import_module(f"kroberta.{name}")
    if name in ("export_keras_hub", "from_keras_hub"):
        from kroberta.interop import keras_hub as keras_hub_preset

        return getattr(keras_hub_preset, name)
    raise AttributeError(f"module 'kroberta' has no attribute {name!r}")


__all__ = ["load", "load_config", "predict", "predict_batches", "fill_mask", "dataset",
           "export_hf", "from_hf", "export_keras_hub", "from_keras_hub", "train", "report"]

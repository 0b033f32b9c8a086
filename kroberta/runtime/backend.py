"""Backend discipline: Keras runs on JAX, TensorFlow is only a CPU input pipeline.

Imported first by `kroberta/__init__.py`. When nothing has imported keras yet this
only sets KERAS_BACKEND. A notebook often imports tensorflow, keras or keras_hub
first, and TensorFlow imports Keras itself at `import tensorflow`, so Keras may
already have picked its default backend; then, as long as no Keras object exists,
kroberta switches Keras to JAX the supported way (`keras.config.set_backend`).
"""

import gc
import importlib
import importlib.abc
import importlib.util
import os
import sys
import types
import warnings

from kroberta.errors import BackendError
from kroberta.runtime import quiet_start

# set_backend drops every module whose name starts with this (keras, keras_hub, ...).
_KERAS_PREFIX = "keras"


def select_jax_backend():
    """Make Keras use JAX; refuse clearly when the user forced another backend.

    Keras reads KERAS_BACKEND once, at its first import. If keras is already
    imported on another backend and holds no objects, it is reloaded on JAX and
    the references other modules (a notebook's `keras`) hold are renewed.
    """
    requested = os.environ.get("KERAS_BACKEND")
    if requested and requested != "jax":
        raise BackendError(
            f"kroberta runs Keras on JAX, but KERAS_BACKEND={requested!r} is set. "
            "Unset it or set KERAS_BACKEND=jax."
        )
    os.environ["KERAS_BACKEND"] = "jax"
    keras = sys.modules.get("keras")
    if keras is None:
        return
    current = keras.backend.backend()
    if current != "jax":
        switch_to_jax(current)


def _live_keras_objects() -> list:
    """Keras layers, models, variables, optimizers, metrics, symbolic tensors alive now."""
    kinds = []
    for module, name in (
        ("keras.src.saving.keras_saveable", "KerasSaveable"),
        ("keras.src.backend.common.variables", "Variable"),
        ("keras.src.backend.common.keras_tensor", "KerasTensor"),
    ):
        kind = getattr(sys.modules.get(module), name, None)
        if kind is not None:
            kinds.append(kind)
    if not kinds:
        return []
    gc.collect()  # objects the user already dropped do not count
    kinds = tuple(kinds)
    return [o for o in gc.get_objects() if isinstance(o, kinds)]


def _old_keras_references() -> dict:
    """{id: (object, module name, attribute or None)} for the loaded keras modules and
    the classes and functions they define: what other modules may hold a reference to."""
    found = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith(_KERAS_PREFIX) or module is None:
            continue
        found[id(module)] = (module, name, None)
        for attribute, value in list(vars(module).items()):
            if (
                isinstance(value, (type, types.FunctionType))
                and id(value) not in found
                and str(getattr(value, "__module__", "")).startswith(_KERAS_PREFIX)
            ):
                found[id(value)] = (value, name, attribute)
    return found


def _renew_references(old: dict) -> int:
    """Points module-level names that held the old keras at the reloaded one."""
    renewed = 0
    for name, module in list(sys.modules.items()):
        if name.startswith(_KERAS_PREFIX) or module is None:
            continue
        try:
            namespace = vars(module)
        except TypeError:
            continue
        for key, value in list(namespace.items()):
            entry = old.get(id(value))
            if entry is None or entry[0] is not value:
                continue
            _, module_name, attribute = entry
            try:
                new = importlib.import_module(module_name)
                if attribute is not None:
                    new = getattr(new, attribute)
            except (ImportError, AttributeError):
                continue  # that module is gone in the reload: leave the name alone
            namespace[key] = new
            renewed += 1
    return renewed


def switch_to_jax(current: str):
    """Reloads an already-imported, still unused Keras on the JAX backend."""
    live = _live_keras_objects()
    if live:
        kinds = sorted({type(o).__name__ for o in live})[:3]
        raise BackendError(
            f"keras was imported before kroberta with the {current!r} backend and already "
            f"holds {len(live)} Keras object(s) built on it ({', '.join(kinds)}); they cannot "
            "move to JAX. Restart Python (in a notebook: restart the kernel) and import "
            "kroberta before building any Keras object, or set KERAS_BACKEND=jax."
        )
    old = _old_keras_references()
    keras = sys.modules["keras"]
    with warnings.catch_warnings():
        # "set_backend is dangerous": it is not here, no Keras object exists yet.
        warnings.simplefilter("ignore", UserWarning)
        keras.config.set_backend("jax")
    keras = importlib.import_module("keras")
    if keras.backend.backend() != "jax":
        raise BackendError(
            f"keras was imported before kroberta with the {current!r} backend and could not "
            "be switched to JAX; restart Python (in a notebook: restart the kernel) and "
            "import kroberta first, or set KERAS_BACKEND=jax."
        )
    _renew_references(old)


def hide_accelerators_from_tensorflow():
    """Keep TensorFlow on the host CPU so it never competes with JAX for a GPU/TPU.

    keras-hub pulls in the full `tensorflow` package (through tensorflow-text), which
    would otherwise grab every GPU's memory or try to own a TPU at its first op.
    Importing TensorFlow costs seconds, and `--help`, the config tools and a notebook
    that only reads a config need none of it: when TensorFlow is not imported yet,
    its devices are hidden the moment something imports it (`_HideWhenImported`),
    before any of its ops can run.
    """
    # Stops TF's TPU discovery and its GPU memory pre-allocation at the source.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # Before TF imports keras, which imports JAX: JAX reads JAX_PLATFORMS on import.
    quiet_start.skip_absent_accelerators()
    tf = sys.modules.get("tensorflow")
    if tf is not None:
        _hide_from_tensorflow(tf)
    elif not any(isinstance(finder, _HideWhenImported) for finder in sys.meta_path):
        sys.meta_path.insert(0, _HideWhenImported())


class _HideWhenImported(importlib.abc.MetaPathFinder):
    """Finds `tensorflow` through the other finders and hides its accelerators right
    after its module has run, inside the filter of its start-up noise."""

    _finding = False  # True while the other finders are asked (find_spec below recurses here)

    def find_spec(self, name, path=None, target=None):
        # Stays armed until TensorFlow runs: libraries probe with importlib.util.find_spec
        # ("is TensorFlow installed?") long before, or without, importing it.
        if name != "tensorflow" or self._finding:
            return None
        self._finding = True
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._finding = False
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _HidingLoader(spec.loader)
        return spec


class _HidingLoader(importlib.abc.Loader):
    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        for finder in [f for f in sys.meta_path if isinstance(f, _HideWhenImported)]:
            sys.meta_path.remove(finder)  # once: TensorFlow is being imported

        # TF's CUDA-stub lines at import and first query.
        with quiet_start.filtered_native_stderr():
            self._loader.exec_module(module)
            _hide_from_tensorflow(module)


def _hide_from_tensorflow(tf):
    for kind in ("GPU", "TPU"):
        try:
            tf.config.set_visible_devices([], kind)
        except (RuntimeError, ValueError):
            # RuntimeError: TF already initialised its devices (someone ran a TF op
            # first); ValueError: no such device type in this TF build.
            visible = tf.config.get_visible_devices(kind) if kind == "GPU" else []
            if visible:
                raise BackendError(
                    "TensorFlow was initialised before kroberta and holds "
                    f"{len(visible)} {kind}(s); import kroberta before running any TF op."
                ) from None

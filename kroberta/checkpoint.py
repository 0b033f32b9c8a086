"""Training checkpoints: weights, optimizer state and step, written atomically.

Layout: run_dir/checkpoints/step_00001200/{state/, meta/, _CHECKPOINT_METADATA},
written by Orbax: `state` holds every model and optimizer variable (the step is the
optimizer's `iteration`), `meta` the variables' paths and shapes. Orbax writes into
`step_00001200.orbax-checkpoint-tmp-*` and renames it into place only when every
process has finished, so a process killed mid-write leaves either the previous
checkpoints or a stray temporary directory that is ignored (and cleaned) on the next
start; a half-written checkpoint is never loaded.

Multi-process and sharded ("fsdp"/"model") runs: every process calls `save` and
`restore` (they are collectives) and writes or reads only the shards its devices
hold; the run directory must be shared by all hosts (NFS, a GCS FUSE mount). A
checkpoint restores into any mesh: the values are resharded to the running layout.
"""

import os
import re
import shutil

import numpy as np

# Orbax is imported where it is used: it costs ~2 s and runs that never checkpoint
# (predict, export) do not need it.

CHECKPOINT_DIR = "checkpoints"
_NAME = re.compile(r"^step_(\d{8})$")


def _variables(model):
    return {"model": list(model.variables), "optimizer": list(model.optimizer.variables)}


def list_checkpoints(run_dir: str) -> list[tuple[int, str]]:
    """Complete checkpoints as (step, path), oldest first."""
    root = os.path.join(run_dir, CHECKPOINT_DIR)
    if not os.path.isdir(root):
        return []
    found = []
    for name in os.listdir(root):
        match = _NAME.match(name)
        path = os.path.join(root, name)
        if match and os.path.isfile(os.path.join(path, "_CHECKPOINT_METADATA")):
            found.append((int(match.group(1)), path))
    return sorted(found)


class CheckpointWriteError(OSError):
    """A checkpoint could not be written; the earlier checkpoints are untouched."""


def estimated_bytes(model) -> int:
    """Size of one checkpoint: every model and optimizer variable."""
    return sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize
               for group in _variables(model).values() for v in group)


def save(model, run_dir: str, step: int, keep: int, extra: dict | None = None) -> str:
    """Writes the model's and optimizer's variables at `step`; keeps the newest `keep`.

    On any write failure (disk full, permissions) the partial checkpoint is removed
    and CheckpointWriteError says so; older checkpoints are never touched before
    the new one is complete.
    """
    import orbax.checkpoint  # noqa: F401  (a missing install is not a write failure)

    root = os.path.join(run_dir, CHECKPOINT_DIR)
    tmp = os.path.join(root, f".tmp-step_{step:08d}-{os.getpid()}")
    try:
        return _save(model, run_dir, root, tmp, step, keep, extra)
    except Exception as error:  # OSError, or Orbax/tensorstore's own wrappers of one
        shutil.rmtree(tmp, ignore_errors=True)
        clean_temporaries(run_dir)  # Orbax's step_*.orbax-checkpoint-tmp-* directory
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise CheckpointWriteError(
            f"could not write the checkpoint at step {step} in {root}: {reason}; "
            "the previous checkpoints are intact") from error


def _checkpointer():
    import orbax.checkpoint as ocp

    return ocp, ocp.Checkpointer(ocp.CompositeCheckpointHandler())


def _save(model, run_dir, root, tmp, step, keep, extra):
    import jax

    ocp, checkpointer = _checkpointer()
    final = os.path.join(root, f"step_{step:08d}")
    state, paths, shapes = {}, {}, {}
    for group, variables in _variables(model).items():
        for i, v in enumerate(variables):
            key = f"{group}/{i:05d}"
            state.setdefault(group, []).append(v.value)  # jax.Arrays, sharded or not
            paths[key], shapes[key] = v.path, list(v.shape)
    meta = {"step": step, "paths": paths, "shapes": shapes, **(extra or {})}
    with checkpointer:
        checkpointer.save(os.path.abspath(final), force=True, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)))
    if jax.process_index() == 0:  # after the save's final barrier: the new one is complete
        for _, old in list_checkpoints(run_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def _stable(path: str) -> str:
    """A variable path without Keras' process-wide counters.

    Dropout layers own seed generators named `seed_generator_<N>`, N counting every
    generator the process has made: a model rebuilt in the same process (a
    resume through the Python API) gets other numbers for the same variables.
    """
    return _SEED_GENERATOR.sub("seed_generator", path)


_SEED_GENERATOR = re.compile(r"seed_generator_\d+")


def restore(model, path: str) -> dict:
    """Loads a checkpoint written by `save` into a built model and optimizer.

    Each value is restored straight into the sharding of the variable it replaces,
    so a checkpoint written on one mesh (or by N processes) loads into another.
    """
    import jax

    ocp, checkpointer = _checkpointer()
    path = os.path.abspath(path)
    with checkpointer:
        meta = checkpointer.restore(path, args=ocp.args.Composite(
            meta=ocp.args.JsonRestore()))["meta"]
        target = {}
        for group, variables in _variables(model).items():
            keys = sorted(k for k in meta["paths"] if k.startswith(group + "/"))
            if len(keys) != len(variables):
                raise ValueError(
                    f"{path}: holds {len(keys)} {group} variables, the model has {len(variables)}"
                )
            for key, v in zip(keys, variables):
                if _stable(meta["paths"][key]) != _stable(v.path) or \
                        tuple(meta["shapes"][key]) != tuple(v.shape):
                    raise ValueError(
                        f"{path}: {key} is {meta['paths'][key]} {tuple(meta['shapes'][key])}, "
                        f"the model expects {v.path} {tuple(v.shape)}"
                    )
            target[group] = [jax.ShapeDtypeStruct(v.value.shape, v.value.dtype,
                                                  sharding=v.value.sharding) for v in variables]
        state = checkpointer.restore(path, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(target)))["state"]
    for group, variables in _variables(model).items():
        for v, value in zip(variables, state[group]):
            v.assign(value)
    return meta


def clean_temporaries(run_dir: str):
    """Removes checkpoints left half-written by a killed process."""
    root = os.path.join(run_dir, CHECKPOINT_DIR)
    if os.path.isdir(root):
        for name in os.listdir(root):
            if name.startswith(".tmp-") or ".orbax-checkpoint-tmp" in name:
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)

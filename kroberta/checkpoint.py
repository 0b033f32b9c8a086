"""Training checkpoints: weights, optimizer state and step, written atomically.

Layout: run_dir/checkpoints/step_00001200/{state.npz, meta.json}. A checkpoint is
written into a temporary directory and renamed into place only when complete, so a
process killed mid-write leaves either the previous checkpoints or a stray
temporary directory that is ignored (and cleaned) on the next start; a
half-written checkpoint is never loaded.
"""

import json
import os
import re
import shutil

import numpy as np

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
        if match and os.path.isfile(os.path.join(path, "meta.json")):
            found.append((int(match.group(1)), path))
    return sorted(found)


def save(model, run_dir: str, step: int, keep: int, extra: dict | None = None) -> str:
    """Writes the model's and optimizer's variables at `step`; keeps the newest `keep`."""
    root = os.path.join(run_dir, CHECKPOINT_DIR)
    os.makedirs(root, exist_ok=True)
    final = os.path.join(root, f"step_{step:08d}")
    tmp = os.path.join(root, f".tmp-step_{step:08d}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    arrays, paths = {}, {}
    for group, variables in _variables(model).items():
        for i, v in enumerate(variables):
            key = f"{group}/{i:05d}"
            arrays[key] = np.asarray(v.value)
            paths[key] = v.path
    np.savez(os.path.join(tmp, "state.npz"), **arrays)
    meta = {"step": step, "paths": paths, **(extra or {})}
    with open(os.path.join(tmp, "meta.json"), "w") as f:
        json.dump(meta, f)
        f.flush()
        os.fsync(f.fileno())
    if os.path.exists(final):
        shutil.rmtree(final)
    os.replace(tmp, final)
    for _, old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def restore(model, path: str) -> dict:
    """Loads a checkpoint written by `save` into a built model and optimizer."""
    with open(os.path.join(path, "meta.json")) as f:
        meta = json.load(f)
    with np.load(os.path.join(path, "state.npz")) as state:
        for group, variables in _variables(model).items():
            keys = sorted(k for k in state.files if k.startswith(group + "/"))
            if len(keys) != len(variables):
                raise ValueError(
                    f"{path}: holds {len(keys)} {group} variables, the model has {len(variables)}"
                )
            for key, v in zip(keys, variables):
                if meta["paths"][key] != v.path or state[key].shape != tuple(v.shape):
                    raise ValueError(
                        f"{path}: {key} is {meta['paths'][key]} {state[key].shape}, "
                        f"the model expects {v.path} {tuple(v.shape)}"
                    )
                v.assign(state[key])
    return meta


def clean_temporaries(run_dir: str):
    """Removes checkpoints left half-written by a killed process."""
    root = os.path.join(run_dir, CHECKPOINT_DIR)
    if os.path.isdir(root):
        for name in os.listdir(root):
            if name.startswith(".tmp-"):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)

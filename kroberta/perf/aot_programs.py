"""The train and predict steps of a kroberta model, lowered for devices that are not here.

Helper of `kroberta.aot`. The model is built on the host exactly as training builds
it (`build_compiled_model`); only the shapes and dtypes of its variables are used.
The steps are the ones the runtime runs, not re-implementations:

  train:   the K-step program `fit` dispatches (`kroberta.model.super_batch.scan_steps` of
           the training model's `train_step`, jitted with donate_argnums=0 and the
           state's shardings, as Keras' trainer does under a distribution);
           state = (trainable, non_trainable, optimizer, metrics variables) as the
           trainer's `_get_jax_state`; data = a (K, batch, ...) super-batch of (x,
           labels), or of unmasked x with mask keys when the step draws dynamic masks
           (`kroberta.model.masked_lm.finish_batch`), each step's slice sharded by the
           distribution's data layout.
  predict: `kroberta.model.predict_program.make_predict_step`, the function `kroberta.predict` jits
           (G batches per dispatch).

XLA's cost analysis counts a loop's body once, whatever its trip count (checked on
this jaxlib: a scan of 4 matmuls reports the FLOPs of one), so the FLOPs of a K-step
or G-batch program are those of one step or batch.
"""

import dataclasses
import re
import time

import jax
import jax.numpy as jnp
import numpy as np

from kroberta.config import Config
from kroberta.model.mlm import build_compiled_model
from kroberta.model.predict_program import make_predict_step
from kroberta.model.super_batch import scan_steps, super_batch_sharding
from kroberta.parallel import distribute
from kroberta.perf.plan import for_local_devices, make_plan


@dataclasses.dataclass(frozen=True)
class Program:
    """One compiled program's per-device memory and cost, as XLA reports them."""

    name: str
    argument_bytes: int
    output_bytes: int
    alias_bytes: int  # outputs written into donated arguments' buffers
    temp_bytes: int
    code_bytes: int
    flops: float  # per device per step: cost_analysis of the SPMD-partitioned program
    steps: int  # steps (or batches) the program runs per dispatch; memory is for all of them
    compile_seconds: float

    @property
    def total_bytes(self) -> int:
        """Peak HBM the program needs on each device."""
        return (
            self.argument_bytes
            + self.output_bytes
            - self.alias_bytes
            + self.temp_bytes
            + self.code_bytes
        )


def build_model(config: Config):
    """The training model, built on the host with no distribution (so variables carry no
    layout of the host's devices); its values are never sent anywhere."""
    # Whole-word masking without the tokenizer: a (V,) word-start table whose values
    # change the masks, not the program.
    word_starts = (
        np.ones(config.model.vocabulary_size, bool) if config.data.whole_word_masking else None
    )
    with distribute.global_distribution(None):
        return build_compiled_model(for_local_devices(config), word_starts)


def _optimizer_shardings(model, distribution, trainable_shardings):
    """Optimizer slots take their model variable's sharding (Keras' `add_variable_from_reference`
    copies the reference's layout); scalars such as `iterations` use the distribution's."""
    by_name = {
        v.path.replace("/", "_"): (tuple(v.shape), s)
        for v, s in zip(model.trainable_variables, trainable_shardings)
    }
    shardings = []
    for v in model.optimizer.variables:
        match = [
            n for n in by_name if v.name.startswith(n + "_") and by_name[n][0] == tuple(v.shape)
        ]
        if match:
            shardings.append(by_name[max(match, key=len)][1])
        else:
            shardings.append(distribution.get_variable_layout(v).backend_layout)
    return shardings


def train_state(model, distribution):
    """(state structs, state shardings) in the trainer's `_get_jax_state` order."""

    def layouts(variables):
        return [distribution.get_variable_layout(v).backend_layout for v in variables]

    trainable = layouts(model.trainable_variables)
    shardings = (
        trainable,
        layouts(model.non_trainable_variables),
        _optimizer_shardings(model, distribution, trainable),
        layouts(model.metrics_variables),
    )
    variables = (
        model.trainable_variables,
        model.non_trainable_variables,
        model.optimizer.variables,
        model.metrics_variables,
    )
    structs = tuple(
        [
            jax.ShapeDtypeStruct(tuple(v.shape), jnp.dtype(v.dtype), sharding=s)
            for v, s in zip(vs, ss)
        ]
        for vs, ss in zip(variables, shardings)
    )
    return structs, shardings


def train_data(
    distribution,
    global_batch: int,
    length: int,
    slots: int,
    steps: int = 1,
    step_input: str | None = None,
):
    """A (steps, batch, ...) super-batch of (x, labels) as `fit` puts it
    on the devices: each step's (batch, ...) slice sharded by the distribution's layout.
    `step_input` (`DataConfig.step_input`): x alone, which the step finishes
    (`kroberta.model.masked_lm.finish_batch`): "mask_keys", unmasked with mask keys (dynamic
    masking); "token_labels", with the files' labels per position (static)."""

    def spec(*shape, dtype=jnp.int32):
        full = (steps, *shape)
        return jax.ShapeDtypeStruct(full, dtype, sharding=super_batch_sharding(distribution, full))

    tokens = {
        "token_ids": spec(global_batch, length),  # (K, B, L)
        "padding_mask": spec(global_batch, length),
    }  # (K, B, L)
    if step_input == "mask_keys":
        return {**tokens, "mask_keys": spec(global_batch, dtype=jnp.uint32)}  # (K, B)
    if step_input == "token_labels":
        return {**tokens, "token_labels": spec(global_batch, length)}  # (K, B, L)
    x = {**tokens, "mask_positions": spec(global_batch, slots)}  # (K, B, M)
    return x, spec(global_batch, slots)  # labels (K, B, M)


def predict_batch(global_batch: int, length: int, group: int = 1):
    """What `kroberta.predict` puts on the devices per dispatch (`inputs.batched`
    minus the host-only `is_real`; a (group, batch, ...) stack if group > 1)."""
    spec = jax.ShapeDtypeStruct((*((group,) if group > 1 else ()), global_batch, length), jnp.int32)
    return {"token_ids": spec, "padding_mask": spec, "marks": spec}


def _analyse(name: str, lowered, steps: int = 1) -> Program | None:
    """Compiles `lowered`; its Program (None on a backend without a memory analysis)."""
    started = time.perf_counter()
    compiled = lowered.compile()
    seconds = time.perf_counter() - started
    memory = compiled.memory_analysis()
    if memory is None:
        return None
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):  # older JAX: one dict per program
        cost = cost[0]
    return Program(
        name=name,
        argument_bytes=int(memory.argument_size_in_bytes),
        output_bytes=int(memory.output_size_in_bytes),
        alias_bytes=int(memory.alias_size_in_bytes),
        temp_bytes=int(memory.temp_size_in_bytes),
        code_bytes=int(memory.generated_code_size_in_bytes),
        flops=float(cost.get("flops", 0.0)),  # the loop body once: one step's
        steps=steps,
        compile_seconds=seconds,
    )


def lower_train(
    model,
    distribution,
    global_batch: int,
    length: int,
    slots: int,
    steps: int = 1,
    step_input: str | None = None,
):
    """Lowers the K-step (`steps`) training program `fit` runs, for the distribution's
    devices (a jax `Lowered`); `step_input` as in `train_data`."""
    # The compiled loss and metrics were built by `compile_model` (on the host;
    # `train_state` gives their variables the distribution's layout).
    data = train_data(distribution, global_batch, length, slots, steps, step_input)
    with distribute.global_distribution(distribution):
        state, shardings = train_state(model, distribution)
        program = jax.jit(
            scan_steps(model.train_step), donate_argnums=0, out_shardings=(None, shardings)
        )
        return program.lower(state, data)


def compile_train(
    model,
    distribution,
    global_batch: int,
    length: int,
    slots: int,
    steps: int = 1,
    step_input: str | None = None,
) -> Program | None:
    """Lowers and compiles the K-step train program; its per-device memory and FLOPs."""
    return _analyse(
        "train",
        lower_train(model, distribution, global_batch, length, slots, steps, step_input),
        steps,
    )


def compile_predict(
    model,
    devices,
    global_batch: int,
    length: int,
    slots: int,
    output: str = "top_k",
    k: int = 5,
    group: int = 1,
) -> Program:
    """Lowers and compiles `kroberta.predict`'s program (`group` batches per dispatch)
    for a batch-axis mesh of `devices`."""
    mesh = jax.sharding.Mesh(np.array(list(devices)), ("batch",))
    with distribute.global_distribution(None):
        step, in_shardings, out_shardings = make_predict_step(model, output, k, mesh, slots, group)
        predicting = model.with_hidden_states()
        weights = [
            [jax.ShapeDtypeStruct(tuple(v.shape), jnp.dtype(v.dtype)) for v in vs]
            for vs in (predicting.trainable_variables, predicting.non_trainable_variables)
        ]
        jitted = jax.jit(step, in_shardings=in_shardings, out_shardings=out_shardings)
        lowered = jitted.lower(*weights, predict_batch(global_batch, length, group))
    return _analyse("predict", lowered, group)


def program_plan(config: Config, devices):
    """The `kroberta.perf.plan.Plan` of `config` on `devices` as one process (a TPU topology's,
    or this host's)."""
    return make_plan(
        config,
        topology=distribute.topology_for(
            config.distributed, config.model, devices, processes=(1, 0)
        ),
    )


def compile_config_train(model, config: Config, devices) -> Program | None:
    """`config`'s training program as `fit` runs it (the plan's global batch, length,
    slots and steps per dispatch; its distribution) compiled for `devices`."""
    plan = program_plan(config, devices)
    return compile_train(
        model,
        distribute.make_distribution(config, devices),
        plan.global_batch,
        plan.sequence_length,
        plan.slots,
        plan.steps_per_dispatch,
        config.data.step_input(),
    )


# XLA's out-of-memory errors, e.g. "Ran out of memory on HBM, the total memory required for
# HLO temporaries (70.86G) exceeds available HBM (15.75G)" or "Used 21.3G of 15.75G hbm".
# The first figure is what the program needs (at least), the second what the device offers
# programs (its memory less XLA's reserve).
_OUT_OF_MEMORY = re.compile(
    r"(?:\(|Used )([\d.]+)([KMGT]?)\)? "
    r"(?:exceeds available HBM \(|of )([\d.]+)([KMGT]?)\)?(?: hbm)?"
)
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def out_of_memory(error: Exception) -> tuple[bool, float | None, float | None]:
    """(whether `error` is XLA running out of device memory, the bytes it says the program
    needs at least, the bytes it says are available), the figures None when it names none."""
    text = str(error)
    if "RESOURCE_EXHAUSTED" not in text and "Ran out of memory" not in text:
        return False, None, None
    found = _OUT_OF_MEMORY.search(text)
    if not found:
        return True, None, None
    return (
        True,
        float(found.group(1)) * _UNITS[found.group(2)],
        float(found.group(3)) * _UNITS[found.group(4)],
    )

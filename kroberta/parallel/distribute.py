"""The device mesh and the Keras distribution that shards every step.

After `kroberta.parallel.startup.initialize` has joined the processes of a
multi-host job, `setup` builds the mesh over the global devices and installs one
of three Keras distributions:

    "data"   mesh (batch=N,): weights replicated, batch split (DataParallel)
    "fsdp"   mesh (batch=N/M, model=M): batch split over all N devices, every large
             weight (and its AdamW moments) split M ways over "model"; XLA gathers a
             weight where it is used and reduce-scatters its gradient
    "model"  mesh (batch=N/M, model=M): tensor parallelism (heads, MLP width and
             embedding width split over "model"); a model group shares its examples

Every process feeds only its own share of each global batch (`Plan.data_shard`); Keras
assembles the global batch with `jax.make_array_from_process_local_data`. The
devices are ordered by process, so process p's rows are the p-th block of a batch.
"""

import contextlib
import dataclasses

import jax
import keras
import numpy as np
from jax.experimental import multihost_utils

from kroberta.config import Config, DistributedConfig, ModelConfig
from kroberta.errors import ConfigError

MODEL_AXIS = "model"
BATCH_AXIS = "batch"


@dataclasses.dataclass(frozen=True)
class Topology:
    """The devices a run uses and how a batch and the weights are split over them."""

    devices: tuple
    platform: str
    mesh_shape: dict
    process_count: int
    process_index: int
    strategy: str = "data"
    local_device_count: int = 0

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def model_parallel(self) -> int:
        return self.mesh_shape.get(MODEL_AXIS, 1)

    @property
    def is_main(self) -> bool:
        """Process 0 writes the run directory's files; every process computes."""
        return self.process_index == 0

    def describe(self) -> str:
        kinds = sorted({d.device_kind for d in self.devices})
        mesh = " x ".join(f"{k}={v}" for k, v in self.mesh_shape.items())
        name = {
            "data": "DataParallel",
            "fsdp": "ModelParallel (fsdp)",
            "model": "ModelParallel (tensor)",
        }[self.strategy]
        return (
            f"{self.num_devices} {self.platform} device(s) ({', '.join(kinds)}) in "
            f"{self.process_count} process(es); mesh {mesh}; {name}"
        )


class _Layout(keras.distribution.TensorLayout):
    """A TensorLayout whose axis may be a tuple of mesh axes (split over both)."""

    def _validate_axes(self):
        names = set(self.device_mesh.axis_names) if self.device_mesh else None
        for axis in self.axes:
            for name in axis if isinstance(axis, tuple) else (axis,):
                if names is not None and name is not None and name not in names:
                    raise ValueError(f"unknown mesh axis {name!r}")


class _FullyShardedData(keras.distribution.ModelParallel):
    """ModelParallel whose batch is split over every device (both mesh axes)."""

    def get_data_layout(self, data_shape):
        return _Layout(
            [(BATCH_AXIS, MODEL_AXIS)] + [None] * (len(data_shape) - 1), self.device_mesh
        )


def layout_map(mesh, strategy: str):
    """Which weights are split over the "model" axis, by keras-hub RoBERTa variable path.

    Shapes: token embedding (vocab, hidden); query/key/value kernels (hidden, heads,
    head_dim); attention output (heads, head_dim, hidden); MLP (hidden, intermediate)
    and (intermediate, hidden). The vocabulary (50265 for RoBERTa) rarely divides the
    mesh, so the embedding is split along its width. Small weights stay replicated.
    """
    m = MODEL_AXIS
    layouts = keras.distribution.LayoutMap(mesh)
    attention = r"transformer_layer_\d+/self_attention_layer/"
    layouts["embeddings/token_embedding/embeddings"] = (None, m)
    if strategy == "model":  # Megatron: split heads and the MLP's inner width
        layouts[attention + r"(query|key|value)/kernel"] = (None, m, None)
        layouts[attention + r"(query|key|value)/bias"] = (m, None)
        layouts[attention + r"attention_output/kernel"] = (m, None, None)
        layouts[r"transformer_layer_\d+/feedforward_intermediate_dense/kernel"] = (None, m)
        layouts[r"transformer_layer_\d+/feedforward_intermediate_dense/bias"] = (m,)
        layouts[r"transformer_layer_\d+/feedforward_output_dense/kernel"] = (m, None)
    else:  # fsdp: storage only; each kernel split along a dimension the mesh divides
        layouts[attention + r"(query|key|value)/kernel"] = (m, None, None)
        layouts[attention + r"attention_output/kernel"] = (None, None, m)
        layouts[r"transformer_layer_\d+/feedforward_intermediate_dense/kernel"] = (None, m)
        layouts[r"transformer_layer_\d+/feedforward_output_dense/kernel"] = (m, None)
        layouts["mlm_head/intermediate_dense/kernel"] = (m, None)
    return layouts


def _model_axis_size(
    distributed: DistributedConfig, model: ModelConfig, num_devices: int, local_devices: int
) -> int:
    size = distributed.model_parallel or local_devices
    source = "distributed.model_parallel" + (
        "" if distributed.model_parallel else f" (0 = the {local_devices} devices per process)"
    )

    def fail(problem):
        raise ConfigError(f"{source}: {problem}")

    if num_devices % size:
        fail(
            f"a model axis of {size} does not divide the {num_devices} devices, so the "
            "batch axis would not be whole"
        )
    if local_devices % size:
        fail(
            f"a model axis of {size} does not divide the {local_devices} devices of a process "
            "(a model group must lie within one process)"
        )
    model.check_model_axis(size, fail)
    return size


def make_distribution(config: Config, devices):
    """The Keras distribution of `config.distributed.strategy` over `devices` (not installed),
    its mesh as `topology_for` lays it out.

    Also used by `kroberta.aot` with the abstract devices of a TPU topology.
    """
    return distribution_for(topology_for(config.distributed, config.model, devices))


def distribution_for(topology: Topology):
    """The Keras distribution that lays out `topology`'s mesh (not installed)."""
    devices = list(topology.devices)
    if topology.strategy == "data":
        # Each process shards its own input (`Plan.data_shard`), so Keras must not.
        return keras.distribution.DataParallel(devices=devices, auto_shard_dataset=False)
    mesh = keras.distribution.DeviceMesh(
        tuple(topology.mesh_shape.values()), tuple(topology.mesh_shape), devices
    )
    cls = _FullyShardedData if topology.strategy == "fsdp" else keras.distribution.ModelParallel
    return cls(
        layout_map=layout_map(mesh, topology.strategy),
        batch_dim_name=BATCH_AXIS,
        auto_shard_dataset=False,
    )


def select_devices(distributed: DistributedConfig) -> tuple:
    """This job's devices ordered by process, the first `distributed.devices` (0: all)."""
    available = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    wanted = distributed.devices or len(available)
    if wanted > len(available):
        raise ConfigError(
            f"distributed.devices: {wanted} requested but JAX sees {len(available)} "
            f"({available[0].platform})"
        )
    if jax.process_count() > 1 and wanted != len(available):
        raise ConfigError(
            f"distributed.devices: must be 0 (all {len(available)} devices) in a "
            f"job of {jax.process_count()} processes, got {wanted}"
        )
    return tuple(available[:wanted])


def setup(distributed: DistributedConfig, model: ModelConfig) -> Topology:
    """Selects the devices, builds the mesh and installs the Keras distribution.

    Every later `fit`/`evaluate` step is one XLA program over the mesh. `model`: the
    shape a model axis must divide (distributed.strategy "fsdp" or "model").
    """
    topology = topology_for(distributed, model, select_devices(distributed))
    keras.distribution.set_distribution(distribution_for(topology))
    return topology


def topology_for(
    distributed: DistributedConfig,
    model: ModelConfig,
    devices,
    strategy: str | None = None,
    processes: tuple[int, int] | None = None,
) -> Topology:
    """The topology of a `distributed` section over `devices`: the mesh `make_distribution`
    builds (nothing installed); a model axis must divide `model`'s shape. `strategy`: None
    for distributed.strategy; `processes`: (count, index), None for this job's
    (`kroberta.aot` describes one process over a TPU topology's devices)."""
    devices = tuple(devices)
    strategy = strategy or distributed.strategy
    count, index = processes or (jax.process_count(), jax.process_index())
    local = sum(d.process_index == index for d in devices)
    mesh_shape = {BATCH_AXIS: len(devices)}
    if strategy != "data":
        size = _model_axis_size(distributed, model, len(devices), local)
        mesh_shape = {BATCH_AXIS: len(devices) // size, MODEL_AXIS: size}
    return Topology(
        devices=devices,
        platform=devices[0].platform,
        mesh_shape=mesh_shape,
        process_count=count,
        process_index=index,
        strategy=strategy,
        local_device_count=local,
    )


def bytes_per_device(variables) -> int:
    """The largest per-device footprint of `variables` (their shard on each device)."""
    per_device = {}
    for v in variables:
        value = v.value
        shard = (
            value.sharding.shard_shape(value.shape) if hasattr(value, "sharding") else value.shape
        )
        size = int(np.prod(shard, dtype=np.int64)) * np.dtype(value.dtype).itemsize
        for device in getattr(value.sharding, "device_set", [None]):
            per_device[device] = per_device.get(device, 0) + size
    return max(per_device.values(), default=0)


def describe_memory(model, topology: Topology) -> str:
    """ "parameters: X MiB per device (...)", for the start-up log."""
    weights = bytes_per_device(model.trainable_variables) / 2**20
    optimizer = bytes_per_device(model.optimizer.variables) / 2**20 if model.optimizer else 0.0
    how = (
        "replicated"
        if topology.strategy == "data"
        else f"sharded over {MODEL_AXIS}={topology.model_parallel}"
    )
    return (
        f"parameters: {weights:.2f} MiB per device ({how}); optimizer state "
        f"{optimizer:.2f} MiB per device"
    )


def to_host(value) -> np.ndarray:
    """The whole array in host memory, even when other processes hold parts of it.

    Every process must call this for the same arrays in the same order when any of
    them is split across processes (it is then a collective).
    """
    if getattr(value, "is_fully_addressable", True) or value.is_fully_replicated:
        return np.asarray(value)

    return np.asarray(multihost_utils.process_allgather(value, tiled=True))


def broadcast_from_main(value: int) -> int:
    """Process 0's integer `value` on every process (a collective: every process calls it;
    `value` itself in a single process)."""
    if jax.process_count() == 1:
        return int(value)
    return int(multihost_utils.broadcast_one_to_all(np.int32(value)))


def barrier(name: str):
    """Waits until every process got here (a no-op in a single process)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


@contextlib.contextmanager
def global_distribution(distribution):
    """Sets Keras' global distribution for the block (None: none), then restores the
    previous one."""
    previous = keras.distribution.distribution()
    keras.distribution.set_distribution(distribution)
    try:
        yield
    finally:
        keras.distribution.set_distribution(previous)

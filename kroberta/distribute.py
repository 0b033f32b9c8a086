"""The device mesh and the Keras distribution that shards every step over it."""

import dataclasses

import jax
import keras

from kroberta.config import Config, ConfigError


@dataclasses.dataclass(frozen=True)
class Topology:
    """The devices a run uses and how a batch is split over them."""

    devices: tuple
    platform: str
    mesh_shape: dict
    process_count: int
    process_index: int

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    def describe(self) -> str:
        kinds = sorted({d.device_kind for d in self.devices})
        mesh = " x ".join(f"{k}={v}" for k, v in self.mesh_shape.items())
        return (f"{self.num_devices} {self.platform} device(s) ({', '.join(kinds)}) in "
                f"{self.process_count} process(es); mesh {mesh}; DataParallel")


def setup(config: Config) -> Topology:
    """Selects the devices, builds the mesh and installs Keras `DataParallel`.

    Every later `fit`/`evaluate` step is one XLA program over the mesh: weights
    replicated, each batch split along its first axis.
    """
    available = jax.devices()
    wanted = config.distributed.devices or len(available)
    if wanted > len(available):
        raise ConfigError(
            f"distributed.devices: {wanted} requested but JAX sees {len(available)} "
            f"({available[0].platform})"
        )
    devices = tuple(available[:wanted])
    distribution = keras.distribution.DataParallel(devices=list(devices))
    keras.distribution.set_distribution(distribution)
    return Topology(
        devices=devices,
        platform=devices[0].platform,
        mesh_shape=dict(zip(distribution.device_mesh.axis_names, distribution.device_mesh.shape)),
        process_count=jax.process_count(),
        process_index=jax.process_index(),
    )


def global_batch_size(config: Config, topology: Topology) -> int:
    return config.train.batch_size_per_device * topology.num_devices

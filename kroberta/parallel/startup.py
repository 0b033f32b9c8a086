"""Multi-host start-up: joining the processes of a job before any JAX computation.

JAX's multi-controller runtime needs every process to call
`jax.distributed.initialize` with the same coordinator; `initialize` finds the job
in the config, the environment or a Cloud TPU VM's own detection, and first meets
the other processes on the coordinator's port (`kroberta.parallel.rendezvous`), so a
missing or mismatched process is a one-line error instead of a fatal abort.
"""

import logging
import os

import jax

from kroberta.config import DistributedConfig
from kroberta.errors import ConfigError
from kroberta.parallel import rendezvous

logger = logging.getLogger(__name__)


def _environment(d: DistributedConfig) -> tuple[str, int, int]:
    """(coordinator, num_processes, process_id): the config, else the variables that
    `keras.distribution.initialize` reads, else JAX's own (unset: "", 0, -1)."""
    env = os.environ
    coordinator = (
        d.coordinator
        or env.get("KERAS_DISTRIBUTION_JOB_ADDRESSES", "").split(",")[0]
        or env.get("JAX_COORDINATOR_ADDRESS", "")
    )
    num = d.num_processes or int(env.get("KERAS_DISTRIBUTION_NUM_PROCESSES", 0))
    pid = d.process_id if d.process_id >= 0 else int(env.get("KERAS_DISTRIBUTION_PROCESS_ID", -1))
    return coordinator.strip(), num, pid


def _on_cloud_tpu_vm() -> bool:
    # Set by `import jax` when libtpu found a TPU; reading it starts no backend.
    try:
        from jax._src import cloud_tpu_init  # private (no public API); a JAX may lack it
    except ImportError:
        return False
    return bool(getattr(cloud_tpu_init, "running_in_cloud_tpu_vm", False))


def initialize(distributed: DistributedConfig) -> bool:
    """Joins a multi-process job when one is configured or detected; True if it did.

    Sources, first found wins: --distributed.coordinator/num_processes/process_id,
    KERAS_DISTRIBUTION_JOB_ADDRESSES/_NUM_PROCESSES/_PROCESS_ID, JAX_COORDINATOR_ADDRESS,
    and on a Cloud TPU VM JAX's own detection of the pod slice's hosts.
    `distributed.num_processes = 1` forces a single process.
    """
    if jax.distributed.is_initialized():
        return jax.process_count() > 1
    coordinator, num, pid = _environment(distributed)
    timeout = distributed.initialization_timeout
    if num == 1 and pid <= 0:
        return False
    # CPU collectives between processes (the default in jax 0.10; explicit for clarity).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if not coordinator:
        if not _on_cloud_tpu_vm():
            if num > 1 or pid >= 0:
                raise ConfigError(
                    "distributed.coordinator: needed (HOST:PORT of process 0) when "
                    "distributed.num_processes or distributed.process_id is set"
                )
            return False
        logger.info(
            "distributed: Cloud TPU VM; JAX detects the pod slice's hosts "
            "(--distributed.num_processes=1 turns this off)"
        )
        jax.distributed.initialize(
            num_processes=num or None,
            process_id=pid if pid >= 0 else None,
            initialization_timeout=timeout,
        )
        return jax.process_count() > 1
    if num < 1:
        raise ConfigError(
            f"distributed.num_processes: needed with distributed.coordinator="
            f"{coordinator!r} (the number of processes in the job)"
        )
    if not 0 <= pid < num:
        raise ConfigError(
            f"distributed.process_id: needed with distributed.coordinator, in [0, {num}), got {pid}"
        )
    logger.info(
        f"distributed: process {pid} of {num}, coordinator {coordinator} "
        f"(waiting up to {timeout} s for the others)"
    )
    rendezvous.meet(coordinator, num, pid, timeout)
    jax.distributed.initialize(
        coordinator, num_processes=num, process_id=pid, initialization_timeout=timeout
    )
    return True

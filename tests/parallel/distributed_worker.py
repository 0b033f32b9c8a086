"""One process of a multi-process test run (started by tests/parallel/test_distributed.py).

    python tests/parallel/distributed_worker.py DEVICES WEIGHTS_NPZ [train arguments ...]

Simulates DEVICES CPU devices, runs `kroberta.train` with the arguments (the
`--distributed.*` flags make it join the job), and writes the weights this process
holds at the end (its local copy of every replicated weight) to WEIGHTS_NPZ.
"""

import faulthandler
import os
import sys

# A hung collective shows where it hangs: every thread's stack, then exit.
faulthandler.dump_traceback_later(
    float(os.environ.get("KROBERTA_TEST_HANG_SECONDS", 240)), exit=True
)

devices, weights_path, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402

import kroberta.cli.train
from kroberta.training import final_model  # noqa: E402


def main() -> int:
    save = final_model.save_run_weights

    def save_and_dump(model, run_dir):
        # This process's own copy: the first addressable shard of each (replicated) weight.
        np.savez(
            weights_path, *[np.asarray(v.value.addressable_shards[0].data) for v in model.weights]
        )
        return save(model, run_dir)

    # train looks it up when it saves the final model
    final_model.save_run_weights = save_and_dump
    return kroberta.cli.train.main(argv)


if __name__ == "__main__":
    sys.exit(main())

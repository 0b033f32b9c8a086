"""How long a checkpoint blocks the step loop: synchronous against asynchronous writes.

    python tools/bench_checkpoint.py                      # roberta-base: ~125M parameters
    python tools/bench_checkpoint.py --config seed --rounds 5

Builds the config's model with its AdamW state (weights + 2 moments: ~1.5 GB in
float32 for the base config), then alternates rounds of kroberta's checkpoint
`Writer` with `asynchronous=False` and `True` into a scratch directory. For each
write it reports the seconds the caller was blocked (what `checkpoint_blocked_seconds`
logs) and, for the asynchronous one, the seconds until the background write
committed. Between an asynchronous save and its commit the main thread runs a
matmul loop, the stand-in for training going on; its rate against an idle
baseline shows what the background write costs the step loop.
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("JAX_PLATFORMS", "cpu")


def _matmuls_per_second(seconds: float, until=None) -> float:
    """A 512^3 jitted matmul in a loop for `seconds` (or until `until()` is true)."""
    import jax
    import jax.numpy as jnp

    x = jnp.ones((512, 512), jnp.float32)
    step = jax.jit(lambda a: a @ a * 1e-3)
    step(x).block_until_ready()
    count, start = 0, time.perf_counter()
    while True:
        x = step(x)
        x.block_until_ready()
        count += 1
        elapsed = time.perf_counter() - start
        if (until is not None and until()) or (until is None and elapsed >= seconds):
            return count / max(elapsed, 1e-9)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="base", help="a shipped config name or a TOML file")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=None, help="scratch directory (default: a new temp dir)")
    args = parser.parse_args(argv)

    from kroberta.config import config_path, load_toml
    from kroberta.model.mlm import build_compiled_model
    from kroberta.perf.plan import for_local_devices
    from kroberta.training import checkpoint

    config = load_toml(config_path(args.config))
    model = build_compiled_model(for_local_devices(config))
    size = checkpoint.estimated_bytes(model)
    print(f"{args.config}: {size / 2**30:.2f} GiB of weights and optimizer state", flush=True)
    scratch = args.dir or tempfile.mkdtemp(prefix="bench_checkpoint-")
    idle_rate = _matmuls_per_second(3.0)
    rows = {"sync": [], "async": []}
    try:
        for round_index in range(args.rounds):
            for mode in ("sync", "async"):
                run_dir = os.path.join(scratch, mode)
                shutil.rmtree(run_dir, ignore_errors=True)
                writer = checkpoint.Writer(run_dir, keep=1, asynchronous=(mode == "async"))
                started = time.perf_counter()
                blocked = writer.save(model, step=round_index + 1)
                rate = None
                if mode == "async":  # the step loop's stand-in runs while the write goes on
                    final = os.path.join(
                        run_dir, checkpoint.CHECKPOINT_DIR, f"step_{round_index + 1:08d}"
                    )
                    rate = _matmuls_per_second(0, until=lambda final=final: os.path.isdir(final))
                writer.close()
                committed = time.perf_counter() - started
                rows[mode].append((blocked, committed, rate))
                print(
                    f"round {round_index + 1} {mode}: blocked {blocked:.2f} s, committed after "
                    f"{committed:.2f} s"
                    + (f", matmul loop at {rate / idle_rate:.2f}x idle" if rate else ""),
                    flush=True,
                )
    finally:
        if args.dir is None:
            shutil.rmtree(scratch, ignore_errors=True)

    def median(mode, i):
        return statistics.median(r[i] for r in rows[mode])

    sync_blocked = median("sync", 0)
    print()
    print("| write | blocked (s, median) | committed after (s, median) | x sync blocked |")
    print("|---|---|---|---|")
    for mode in ("sync", "async"):
        print(
            f"| {mode} | {median(mode, 0):.2f} | {median(mode, 1):.2f} | "
            f"{median(mode, 0) / sync_blocked:.3f} |"
        )
    print(
        f"\nmatmul loop during the async writes: {median('async', 2) / idle_rate:.2f}x its idle "
        f"rate ({idle_rate:.1f} matmuls/s idle)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

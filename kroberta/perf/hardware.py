"""What accelerators can do: bf16 peak FLOP/s and memory per device.

Vendor figures per device as JAX counts devices (a TPU v2/v3 "device" is one
core; v4/v5p are one chip of two fused cores; v5e/v6e one single-core chip).
Used for MFU (model FLOPs utilisation) and for ahead-of-time fit checks.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Chip:
    name: str
    bf16_flops: float  # peak dense bf16 FLOP/s per device
    memory_bytes: int  # HBM per device


GiB = 2**30


def size_text(n: float) -> str:
    """A byte count as people read it: "1.25 GiB", "14.3 MiB", "1.0 KiB", "100 bytes"
    (the largest unit of which it is at least a quarter)."""
    for unit, size, digits in (("GiB", GiB, 2), ("MiB", 2**20, 1), ("KiB", 2**10, 1)):
        if n >= size / 4:
            return f"{n / size:.{digits}f} {unit}"
    return f"{n:.0f} bytes"


CHIPS = {
    "v2": Chip("TPU v2", 22.5e12, 8 * GiB),
    "v3": Chip("TPU v3", 61.5e12, 16 * GiB),
    "v4": Chip("TPU v4", 275e12, 32 * GiB),
    "v5e": Chip("TPU v5e", 197e12, 16 * GiB),
    "v5p": Chip("TPU v5p", 459e12, 95 * GiB),
    "v6e": Chip("TPU v6e", 918e12, 32 * GiB),
    "a100": Chip("NVIDIA A100", 312e12, 80 * GiB),
    "h100": Chip("NVIDIA H100", 989e12, 80 * GiB),
    "h200": Chip("NVIDIA H200", 989e12, 141 * GiB),
}


def chip_for_device_kind(device_kind: str) -> Chip | None:
    """Maps `jax.Device.device_kind` ("TPU v4", "TPU v5 lite", "NVIDIA H100 80GB HBM3") to a Chip."""
    kind = device_kind.lower()
    if "tpu" in kind:
        if "v5 lite" in kind or "v5e" in kind or "v5litepod" in kind:
            return CHIPS["v5e"]
        if "v6" in kind:
            return CHIPS["v6e"]
        if "v5" in kind:
            return CHIPS["v5p"]
        for version in ("v4", "v3", "v2"):
            if version in kind:
                return CHIPS[version]
    for name in ("h200", "h100", "a100"):
        if name in kind:
            return CHIPS[name]
    return None

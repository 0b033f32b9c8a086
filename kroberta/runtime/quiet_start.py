"""A quiet start: no TensorFlow, CUDA or libtpu start-up noise where they have nothing to say.

Where each line came from on a CPU machine, and what stops it:

- `cudart_stub.cc ... Could not find cuda drivers on your machine` (twice) and
  `WARNING: All log messages before absl::InitializeLog() is called are written to
  STDERR`: the full `tensorflow` package (keras-hub pulls it in through
  tensorflow-text) loads its CUDA stubs at `import tensorflow` and logs through absl
  before absl is initialised, so TF_CPP_MIN_LOG_LEVEL does not reach these lines.
- `E0000 ... cuda_platform.cc ... failed call to cuInit`: TF's CUDA platform at its
  first device query (kroberta's `set_visible_devices`), logged as an error although
  kroberta never lets TensorFlow use a GPU.
  Both are filtered out of the native stderr while TensorFlow starts
  (`filtered_native_stderr`): lines below TF_CPP_MIN_LOG_LEVEL and TF's CUDA-driver
  complaints are dropped, every other line (a real error, a Python warning) is
  passed on as it arrives.
- `could not determine TPU accelerator type, please set env var TPU_ACCELERATOR_TYPE`,
  `WARNING: Logging before InitGoogle()`, `E0000 ... unexpected worker hostname ...
  TPU_WORKER_HOSTNAMES` and a `Source Location Trace`: with libtpu installed (the
  `tpu` extra) JAX tries its TPU backend on any machine, libtpu prints these, and
  JAX falls back to the CPU. On a machine with no accelerator JAX can use, kroberta
  sets JAX_PLATFORMS=cpu (`skip_absent_accelerators`): the backend JAX would have
  ended up with, without the failed attempt. Where kroberta loads libtpu on purpose
  on such a machine (ahead-of-time TPU compilation), those lines are filtered out
  (`quiet_libtpu_probe`).
"""

import contextlib
import glob
import importlib.util
import os
import re
import sys
import threading
import warnings

# TF_CPP_MIN_LOG_LEVEL: 0 shows everything, 1 hides INFO, 2 WARNING, 3 ERROR.
_SEVERITIES = "IWEF"
# An absl/glog line: severity letter, MMDD, time, thread id, file:line].
_ABSL_LINE = re.compile(rb"^([IWEF])\d{4} [\d:. ]+\s+\d+ [\w.-]+:\d+\]")
# TensorFlow's complaints about CUDA drivers: kroberta hides GPUs from TensorFlow, so a
# CPU-only TensorFlow has nothing to say about them (JAX reports its own GPU errors).
_TF_CUDA_NOISE = (
    rb"cudart_stub\.cc:\d+\]",
    rb"cuda_platform\.cc:\d+\] failed call to cuInit",
    rb"cuda_executor\.cc:\d+\]",
    rb"cuda_diagnostics\.cc:\d+\]",
    rb"Unable to register cu(DNN|FFT|BLAS) factory",
    rb"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR",
)
_TF_CUDA_NOISE_RE = re.compile(b"|".join(_TF_CUDA_NOISE))
_GOOGLE_PCI_VENDOR = "0x1ae0"  # TPUs (and nothing else on a host) carry Google's PCI vendor id
_GPU_DEVICE_FILES = ("/dev/nvidia0", "/dev/nvidiactl", "/dev/dxg", "/dev/kfd")


def is_noise(line: bytes, min_log_level: int) -> bool:
    """Whether a native stderr line from TensorFlow's start is noise to drop."""
    if _TF_CUDA_NOISE_RE.search(line):
        return True
    match = _ABSL_LINE.match(line)
    return bool(match) and _SEVERITIES.index(match.group(1).decode()) < min(min_log_level, 3)


# libtpu's start on a machine without a TPU (the ahead-of-time compiler loads it on purpose):
# it cannot find the TPU metadata it looks for and says so, with a source-location trace.
_LIBTPU_PROBE_NOISE_RE = re.compile(
    rb"could not determine TPU (accelerator type|worker hostnames)"
    rb"|^WARNING: Logging before InitGoogle\(\) is written to STDERR"
    rb"|^=== Source Location Trace: ===\s*$"
    rb"|^[\w./-]+\.cc:\d+\s*$"
)  # the trace's bare file:line entries


def is_libtpu_probe_noise(line: bytes) -> bool:
    """Whether a native stderr line is libtpu's complaint about a missing TPU."""
    return bool(_LIBTPU_PROBE_NOISE_RE.search(line))


@contextlib.contextmanager
def quiet_libtpu_probe():
    """Drop libtpu's missing-TPU lines while the block loads it, where no TPU is present
    (on a TPU host every line passes: there they would mean something)."""
    if _accelerator_present():
        yield
        return
    with filtered_native_stderr(is_libtpu_probe_noise):
        yield


# The descriptors stderr had before `filtered_native_stderr` pointed descriptor 2 at its
# pipe, outermost first.
_ORIGINAL_STDERR = []


def stderr_descriptor() -> int:
    """The process's stderr as a descriptor: 2, or while TensorFlow starts (descriptor 2
    then feeds a filter thread) the one 2 stood for, for a line that must reach the
    terminal although the process ends at once (`os._exit`)."""
    return _ORIGINAL_STDERR[0] if _ORIGINAL_STDERR else 2


@contextlib.contextmanager
def filtered_native_stderr(noise=None):
    """Pass file descriptor 2 through `noise` (default: `is_noise` at TF_CPP_MIN_LOG_LEVEL)
    while the block runs.

    Native libraries write to the descriptor, not to `sys.stderr`, so the descriptor
    is pointed at a pipe whose reader thread forwards each line that is not noise
    at once (a crash inside the block still shows what came before it).
    """
    try:
        sys.stderr.flush()
        original = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no usable stderr (some embedders)
        yield
        return
    if noise is None:
        try:
            level = int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0"))
        except ValueError:
            level = 0

        def noise(line):
            return is_noise(line, level)

    read_end, write_end = os.pipe()

    def forward():
        with os.fdopen(read_end, "rb") as pipe:
            for line in pipe:
                if not noise(line):
                    os.write(original, line)

    reader = threading.Thread(target=forward, name="kroberta-stderr-filter", daemon=True)
    reader.start()
    _ORIGINAL_STDERR.append(original)
    os.dup2(write_end, 2)
    os.close(write_end)
    try:
        yield
    finally:
        _ORIGINAL_STDERR.remove(original)
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()
        os.dup2(original, 2)  # closes the pipe's last write end: the reader sees EOF
        reader.join(timeout=10)
        os.close(original)


def _jax_plugins_installed() -> bool:
    """A PJRT plugin package (jax[cuda12], ROCm, ...) that JAX would try."""
    try:
        if importlib.util.find_spec("jax_plugins") is not None:
            return True
    except (ImportError, ValueError):
        return True
    # start-up: runs at `import kroberta`, only on this path
    from importlib.metadata import entry_points

    return bool(entry_points(group="jax_plugins"))


def _accelerator_present() -> bool:
    if any(os.path.exists(path) for path in _GPU_DEVICE_FILES):
        return True
    for vendor in glob.glob("/sys/bus/pci/devices/*/vendor"):
        with contextlib.suppress(OSError), open(vendor) as f:
            if f.read().strip() == _GOOGLE_PCI_VENDOR:
                return True
    return False


def skip_absent_accelerators() -> bool:
    """Set JAX_PLATFORMS=cpu where JAX could only end up on the CPU anyway.

    Only when the user chose no platforms (JAX_PLATFORMS unset, JAX_FORCE_TPU_INIT
    unset), no TPU, GPU or other accelerator device is present and no JAX plugin
    package is installed. Returns whether it set the platform.
    """
    if "JAX_PLATFORMS" in os.environ or "JAX_FORCE_TPU_INIT" in os.environ:
        return False
    if _accelerator_present() or _jax_plugins_installed():
        return False
    if "jax" in sys.modules:
        # only when JAX is loaded already: importing it here would load it (start-up)
        import jax

        from kroberta.runtime.xla_cpu import backend_started

        if backend_started() or jax.config.jax_platforms:
            return False
        jax.config.update("jax_platforms", "cpu")
        return True
    os.environ["JAX_PLATFORMS"] = "cpu"
    return True


# kagglehub (imported by keras-hub) imports `tqdm.auto`, which in a Jupyter kernel without
# ipywidgets warns once at import that it cannot draw notebook bars. kroberta draws its own
# bars; the notice is about a library the user never called.
TQDM_NOTEBOOK_NOTICE = r"IProgress not found"


def ignore_tqdm_notebook_notice():
    """Drop tqdm's import-time ipywidgets notice (only that message)."""
    warnings.filterwarnings("ignore", message=TQDM_NOTEBOOK_NOTICE)

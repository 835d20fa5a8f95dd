"""The process environment of a `bert-jax` command: quiet on CPU hosts, TensorFlow kept off accelerators.

TensorFlow is only the data library here (tf.data, TFRecord, summaries). Imported as it is, it prints
a dozen C++ lines on a CPU host (oneDNN, missing CUDA drivers, cuInit) before any line of ours, and on
a GPU host it would reserve the memory JAX needs. `import_tensorflow()` is the one place it is
imported: its start-up lines are swallowed (and shown if the import fails) and it sees no GPU.
`configure()` runs first in every command, before JAX is imported.
The malloc a command runs with is `malloc.py`'s choice, made before this runs.
"""

import contextlib
import functools
import glob
import os
import sys
import tempfile

# Device files of the accelerators JAX has plugins for: TPU VMs (/dev/accel*, /dev/vfio), NVIDIA, AMD.
_ACCELERATOR_DEVICES = ("/dev/accel*", "/dev/vfio/[0-9]*", "/dev/nvidia[0-9]*", "/dev/kfd")


def has_accelerator() -> bool:
  return any(glob.glob(pattern) for pattern in _ACCELERATOR_DEVICES)


def configure() -> None:
  """Environment defaults for a command; a variable the user set is never changed."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")   # TensorFlow's C++ INFO and WARNING lines
  if not has_accelerator():
    # No accelerator device: JAX's TPU plugin (libtpu, e.g. installed for `bert-jax aot`) would only
    # print warnings while probing for chips. `bert-jax aot` asks for its TPU topology explicitly.
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


@contextlib.contextmanager
def _quiet_stderr():
  """Redirects the C-level stderr (fd 2) into a temporary file; replays it if the block raises."""
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as captured:
    os.dup2(captured.fileno(), 2)
    try:
      yield
    except BaseException:
      os.dup2(saved, 2)
      captured.seek(0)
      sys.stderr.write(captured.read().decode("utf-8", "replace"))
      raise
    finally:
      os.dup2(saved, 2)
      os.close(saved)


@functools.cache
def import_tensorflow():
  """`tensorflow`, imported quietly and with no GPU visible to it (JAX owns the accelerators)."""
  with _quiet_stderr():
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    tf.config.set_visible_devices([], "GPU")
  return tf

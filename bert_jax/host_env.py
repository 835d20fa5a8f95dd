"""The process environment of a `bert-jax` command: quiet on CPU hosts, TensorFlow kept off accelerators.

TensorFlow is only the data library here (tf.data, TFRecord, summaries). Imported as it is, it prints
a dozen C++ lines on a CPU host (oneDNN, missing CUDA drivers, cuInit) before any line of ours, and on
a GPU host it would reserve the memory JAX needs. `import_tensorflow()` is the one place it is
imported: its start-up lines are swallowed (and shown if the import fails) and it sees no GPU.
`configure()` runs first in every command, before JAX is imported.

A command that compiles for a TPU on this host (`COMPILING_COMMANDS`) runs with a faster malloc than
glibc's where one is installed (`reexec_with_allocator`): XLA's TPU compiler spends a quarter of its time
allocating and freeing.
"""

import contextlib
import ctypes.util
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


# Commands that compile for a TPU on this host. BERT-large's phase 1 for v3:8x8 compiled in 31.5 to 32.1 s with
# glibc's malloc, 23.8 to 24.0 s with jemalloc, 24.8 to 26.4 s with tcmalloc, 26.3 s with TBB's (a 2-core CPU,
# docs/performance.md): the compiler's code generation allocates small objects by the million.
COMPILING_COMMANDS = ("aot", "bench kernel")
# The allocator to preload: unset picks the first of ALLOCATORS installed; "system" keeps the C library's.
ALLOCATOR_VARIABLE = "BERT_JAX_MALLOC"
_REEXEC_MARK = "BERT_JAX_MALLOC_PRELOADED"   # set in the re-executed process: never twice


def _tbbmalloc() -> list[str]:
  """pip's `tbb` wheel (the `tpu` extra) puts its libraries in the environment's lib/; the proxy, which
  replaces malloc, needs the allocator library loaded before it."""
  paths = [os.path.join(sys.prefix, "lib", name) for name in ("libtbbmalloc.so.2", "libtbbmalloc_proxy.so.2")]
  return paths if all(os.path.exists(p) for p in paths) else []


def _system_library(name: str) -> list[str]:
  found = ctypes.util.find_library(name)   # a name the dynamic loader finds in its cache
  return [found] if found else []


# name -> what LD_PRELOAD names to load it, best first (the compile times above).
ALLOCATORS = {
    "jemalloc": lambda: _system_library("jemalloc"),                # apt-get install libjemalloc2
    "tcmalloc": lambda: _system_library("tcmalloc_minimal"),        # apt-get install libtcmalloc-minimal4
    "tbbmalloc": _tbbmalloc,                                        # pip install tbb
}
_MAPPED_NAMES = {"jemalloc": "libjemalloc", "tcmalloc": "libtcmalloc", "tbbmalloc": "libtbbmalloc_proxy"}


def allocator_in_use(maps_path: str = "/proc/self/maps") -> str:
  """The malloc this process runs with: a name of ALLOCATORS loaded into it, else "system"."""
  try:
    with open(maps_path) as f:
      maps = f.read()
  except OSError:
    return "system"
  return next((name for name, lib in _MAPPED_NAMES.items() if lib in maps), "system")


def allocator_preload(environ, find=None) -> dict[str, str] | None:
  """The environment to run this command again in, with a faster malloc preloaded; None to run on as it is:
  not Linux, already run again, `BERT_JAX_MALLOC=system`, one already in use, or none installed."""
  find = find or (lambda name: ALLOCATORS[name]())
  choice = environ.get(ALLOCATOR_VARIABLE, "")
  if not sys.platform.startswith("linux") or environ.get(_REEXEC_MARK) or choice == "system":
    return None
  if choice and choice not in ALLOCATORS:
    raise ValueError(f"{ALLOCATOR_VARIABLE}={choice!r}: one of {sorted(ALLOCATORS)} or 'system'")
  if allocator_in_use() != "system":
    return None
  for name in [choice] if choice else list(ALLOCATORS):
    if libraries := find(name):
      preload = " ".join(libraries + environ.get("LD_PRELOAD", "").split())
      return {**environ, "LD_PRELOAD": preload, _REEXEC_MARK: name}
  return None


def reexec_with_allocator() -> None:
  """Runs this command again, from the start and as the same process, with `allocator_preload`'s malloc;
  returns when there is none to add."""
  env = allocator_preload(os.environ)
  if env is not None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, sys.orig_argv, env)


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

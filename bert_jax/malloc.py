"""The malloc a `bert-jax` command runs with: the C library's, or a faster one preloaded where installed.

Two kinds of work here spend much of their time in glibc's allocator (docs/performance.md, "The
compiler's malloc" and "On this CPU"):
- XLA's TPU compiler (`bert-jax aot`, `bench kernel`) makes and drops small objects by the million:
  15.5% of a profile of its compile in glibc's malloc and free. BERT-large's phase 1 for v3:8x8 compiled
  in 30.8 to 32.7 s with glibc's, 23.4 to 24.8 s with jemalloc, 25.3 to 26.4 s with tcmalloc and 25.5 to
  26.6 s with TBB's, on a 2-core CPU.
- A train step on XLA:CPU allocates its temporary buffers each step. glibc maps a block over 32 MB fresh
  from the kernel and unmaps it when it is freed, so every step faults its pages in again (2.1 million
  page faults in 22 steps of `bench train`'s model, against 0.37 million with tcmalloc): 0.46 s a step
  against 0.37 to 0.40 s with tcmalloc, or jemalloc told to keep freed pages. TBB's returns them (0.47 s).
  glibc's own in transparent huge pages (no library to install; 0.17 million faults, 0.42 s) is taken
  only where named: it slowed a peer's step that allocates larger arrays.

`reexec(command)` runs the command again as the same process (`execve`: the same PID, arguments and
standard streams) with the first installed allocator that helps it, or `BERT_JAX_MALLOC`'s if set (one
line on stderr where that one is not installed or not for the command). A process started with its own
LD_PRELOAD is left as it is. The steps only
where no accelerator is attached: only there were they measured. Standard library only: `bench_peers`'
child loads this file by its path to say which malloc a peer ran with.
"""

from __future__ import annotations   # the peers' Python may be older than ours

import os
import subprocess
import sys

VARIABLE = "BERT_JAX_MALLOC"   # an ALLOCATORS name, or "system" for the C library's; unset: the first that helps
_MARK = "BERT_JAX_MALLOC_PRELOADED"   # set in the process run again: never twice


def _tbbmalloc() -> list[str] | None:
  """pip's `tbb` wheel (the `tpu` extra) puts its libraries in the environment's lib/; the proxy, which
  replaces malloc, needs the allocator's own library loaded before it."""
  paths = [os.path.join(sys.prefix, "lib", name) for name in ("libtbbmalloc.so.2", "libtbbmalloc_proxy.so.2")]
  return paths if all(os.path.exists(p) for p in paths) else None


def _system_library(soname: str) -> list[str] | None:
  """The path of `soname` in the dynamic loader's cache (`ldconfig -p`; a 64-bit build's first), None where
  it has none."""
  for ldconfig in ("/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"):
    try:
      listing = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
      continue
    found = []   # lines as "\tlibjemalloc.so.2 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
    for line in listing.splitlines():
      name, _, path = line.strip().partition(" => ")
      if name.split(" ")[0] == soname and os.path.exists(path):
        found.append((("64" in name) != (sys.maxsize > 2**32), path))
    return [min(found)[1]] if found else None
  return None


_HUGE_PAGES = "glibc.malloc.hugetlb=1"


def _glibc_huge_pages() -> list[str] | None:
  """glibc's own malloc, its large blocks in transparent huge pages (`GLIBC_TUNABLES`, glibc 2.35 and later,
  with the kernel's huge pages on "always" or "madvise"): nothing to preload."""
  try:
    version = tuple(int(x) for x in os.confstr("CS_GNU_LIBC_VERSION").split()[1].split(".")[:2])
    with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
      mode = f.read()
  except (ValueError, OSError, IndexError, AttributeError):
    return None
  return [] if version >= (2, 35) and ("[always]" in mode or "[madvise]" in mode) else None


# name -> (what LD_PRELOAD names to load it, None where it is not installed; its library's file name, or the
# glibc tunable that turns it on)
ALLOCATORS = {
    "jemalloc": (lambda: _system_library("libjemalloc.so.2"), "libjemalloc"),        # apt-get install libjemalloc2
    "tcmalloc": (lambda: _system_library("libtcmalloc_minimal.so.4"), "libtcmalloc"),   # libtcmalloc-minimal4
    "tbbmalloc": (_tbbmalloc, "libtbbmalloc_proxy"),                                 # pip install tbb
    "glibc-huge-pages": (_glibc_huge_pages, _HUGE_PAGES),
}
_TUNABLES = "GLIBC_TUNABLES"
# jemalloc hands freed pages back to the kernel after 10 s by default; a step wants them kept for the next
# step (0.381 s against 0.465), the compiler does not (v3:8x8 phase 1: 26.2 and 26.5 s against 24.7 and 24.4).
_KEEP_PAGES = {"MALLOC_CONF": "dirty_decay_ms:-1,muzzy_decay_ms:-1"}
_COMPILING = {"jemalloc": {}, "tcmalloc": {}, "tbbmalloc": {}}
# TBB's hands the pages back too (0.473 s). glibc's own in huge pages faults them in 2 MB at a time (0.420
# to 0.427 s) but took Hugging Face Flax's step, which allocates its [16, 128, 30522] logits each step, from
# 1.42 to 2.44 s: only where named (BERT_JAX_MALLOC=glibc-huge-pages).
_STEPPING = {"jemalloc": _KEEP_PAGES, "tcmalloc": {}}
# command -> the allocators that help it, best first, each with its environment defaults; other commands
# keep the C library's.
COMMANDS = {"aot": _COMPILING, "bench kernel": _COMPILING, "pretrain": _STEPPING, "finetune": _STEPPING,
            "sweep": _STEPPING, "ablate": _STEPPING, "bench train": _STEPPING}


def in_use(maps_path: str = "/proc/self/maps") -> str:
  """The malloc this process runs with: a name of ALLOCATORS loaded into it or turned on, else "system"."""
  try:
    with open(maps_path) as f:
      maps = f.read()
  except OSError:
    maps = ""
  tunables = os.environ.get(_TUNABLES, "")   # read by glibc when the process started
  return next((name for name, (_, mark) in ALLOCATORS.items() if mark in maps or mark in tunables.split(":")),
              "system")


def candidates(command: str, accelerator: bool) -> dict[str, dict[str, str]]:
  """The allocators that help `command`, best first, with their environment defaults: none for a step on an
  accelerator host."""
  choices = COMMANDS.get(command, {})
  return choices if choices is _COMPILING or not accelerator else {}


def preload(environ, choices: dict[str, dict[str, str]], find=None) -> dict[str, str] | None:
  """The environment to run the command again in, with the first of `choices` (or `BERT_JAX_MALLOC`'s) that
  is installed preloaded; None to run on as it is: not Linux, already run again, `BERT_JAX_MALLOC=system`,
  the user's own LD_PRELOAD (a malloc, a sanitizer or a profiler that must come first), or none installed."""
  find = find or (lambda name: ALLOCATORS[name][0]())
  choice = environ.get(VARIABLE, "")
  if choice and choice != "system" and choice not in ALLOCATORS:
    raise ValueError(f"{VARIABLE}={choice!r}: one of {', '.join(ALLOCATORS)} or system")
  if (not sys.platform.startswith("linux") or environ.get(_MARK) or choice == "system"
      or environ.get("LD_PRELOAD", "").strip() or in_use() != "system"):
    return None
  for name in [choice] if choice else choices:
    if (libraries := find(name)) is not None:
      env = {**choices.get(name, {}), **environ}   # the user's own settings win
      if ALLOCATORS[name][1] == _HUGE_PAGES:   # turned on beside the user's own tunables
        env[_TUNABLES] = ":".join([t for t in env.get(_TUNABLES, "").split(":") if t] + [_HUGE_PAGES])
      if libraries:
        env["LD_PRELOAD"] = " ".join(libraries)
      return env | {_MARK: name}
  return None


def reexec(command: str, accelerator: bool) -> None:
  """Runs `command` again, from the start and as the same process, with `preload`'s malloc; returns when
  there is none to add, or the process could not be run again (one line on stderr). A `BERT_JAX_MALLOC` that
  names no allocator is a ValueError."""
  if not (choices := candidates(command, accelerator)):
    return
  env = preload(os.environ, choices)
  if env is None:
    if (choice := os.environ.get(VARIABLE, "system")) != "system" and not os.environ.get(_MARK):
      print(f"{VARIABLE}={choice}: not installed or not for this command; running with the C library's malloc",
            file=sys.stderr)
    return
  sys.stdout.flush()
  sys.stderr.flush()
  try:
    os.execve(sys.executable, sys.orig_argv, env)
  except (OSError, ValueError) as e:   # no interpreter to run again (an embedded one): go on as it is
    print(f"could not run again with {env[_MARK]}: {e}; running with the C library's malloc", file=sys.stderr)

"""`bert-jax aot --search_mesh`: compile a config for a topology on each (data, fsdp, tensor) split of its
devices and rank the splits by the estimated step time of `aot.run`'s report.

    bert-jax aot --config=configs/bert_large.py:phase1,v5e:8x8 --search_mesh --mesh_candidates=2x32x1,2x16x2

The configs ship the mesh it picks for their topology (`configs/bert_large.py`'s `MESHES`).
"""

import ctypes
import gc
import math
from typing import Any

from bert_jax import failures
from bert_jax.tools import aot
from bert_jax.tpu_chips import GiB


def mesh_candidates(config, num_devices: int, max_tensor: int = 8) -> list[tuple[int, int, int]]:
  """The (data, fsdp, tensor) splits of one slice's devices that `config` can run on: the batch rows of a
  micro-batch divide over data x fsdp, and the mesh axes divide every size of the encoders that the logical
  rules (`config.logical_axis_rules`) split over them (`sharding.uneven_axes`: the hidden size over fsdp;
  the heads, the feed-forward width and the vocabulary over tensor; jit refuses uneven shardings); tensor is
  at most `max_tensor`. Slices (`mesh.dcn_*`) are kept as the config has them and multiply each axis."""
  from bert_jax import objectives, sharding  # pylint: disable=g-import-not-at-top
  models = objectives.encoder_configs(config)   # presets resolved; ELECTRA's generator too
  rules = sharding.logical_rules(config)
  dcn = sharding.dcn_mesh_shape(config.mesh)
  per_slice = num_devices // math.prod(dcn)
  rows = config.global_batch_size // int(config.micro_batches)
  divisors = lambda n: [d for d in range(1, n + 1) if n % d == 0]   # noqa: E731
  out = []
  for tensor in divisors(per_slice):
    if tensor > max_tensor:
      continue
    for fsdp in divisors(per_slice // tensor):
      data = per_slice // tensor // fsdp
      ways = dict(zip(sharding.MESH_AXES, (data * dcn[0], fsdp * dcn[1], tensor * dcn[2])))
      if rows % (ways["data"] * ways["fsdp"]) == 0 and not any(
          sharding.uneven_axes(rules, m.split_axis_sizes, ways) for m in models):
        out.append((data, fsdp, tensor))
  return out


def search_mesh(config, topology: str, candidates=None, log=print) -> list[dict[str, Any]]:
  """Compile `config` for `topology` on every mesh of `candidates` (default `mesh_candidates`) and return
  the reports, best first (`rank`): those that fit by estimated step time, then those that do not. A split that
  jit or the compiler refuses is logged and left out; none left is an error."""
  from bert_jax import sharding  # pylint: disable=g-import-not-at-top
  n = len(aot.topology_devices(topology))
  per_slice = n // math.prod(sharding.dcn_mesh_shape(config.mesh))
  candidates = mesh_candidates(config, n) if candidates is None else [tuple(c) for c in candidates]
  if not candidates:
    raise failures.UserError(f"no (data, fsdp, tensor) split of {topology}'s {n} devices suits this config")
  if wrong := [c for c in candidates if len(c) != 3 or math.prod(c) != per_slice]:
    raise failures.UserError(f"meshes {wrong} are not data x fsdp x tensor of {topology}'s {per_slice} devices "
                             "per slice")
  reports = []
  for data, fsdp, tensor in candidates:
    c = config.copy_and_resolve_references()
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = data, fsdp, tensor
    try:
      r = aot.run(c, topology)
    except Exception as e:  # pylint: disable=broad-except
      why = " ".join(str(e).split()) if isinstance(e, failures.UserError) else aot.first_line(e)  # the config's
      log(f"  {data}x{fsdp}x{tensor}: refused: {why[:300]}")
      continue
    finally:
      release_memory()
    reports.append(r)
    log(summary_line(r))
  if not reports:
    raise failures.UserError(f"every mesh of {candidates} was refused for {topology} (see above)")
  return sorted(reports, key=rank)


def rank(r: dict[str, Any]) -> tuple:
  """A search's order: those that fit by estimated step time, equal step times to the shorter memory time
  (the most slack), then those that do not fit."""
  t = r["time_per_step"]
  if not r["memory_per_device"]["fits"]:
    return (True, 0.0, 0.0)
  return (False, t["step_seconds"], t["memory_seconds"])


def release_memory() -> None:
  """Between a search's compiles: drop what jax caches of the last split (each split traces, lowers and
  compiles anew) and hand the freed heap back to the system, so that the process does not grow with every
  split (glibc keeps freed memory otherwise)."""
  import jax  # pylint: disable=g-import-not-at-top
  jax.clear_caches()
  gc.collect()
  try:
    ctypes.CDLL("libc.so.6").malloc_trim(0)
  except (OSError, AttributeError):   # not glibc
    pass


def summary_line(r: dict[str, Any]) -> str:
  """One line of a mesh search: the mesh, memory, step estimate, bound, compile time."""
  m, t = r["memory_per_device"], r["time_per_step"]
  mesh = "x".join(str(v) for v in r["mesh"].values())
  if t is None:
    needed = f"{m['temp_bytes'] / GiB:.2f} GiB temporaries" if m.get("temp_bytes") else "out of memory"
    return f"  {mesh:>10}  DOES NOT FIT ({needed}); compiled in {r['compile_seconds']:.0f} s"
  return (f"  {mesh:>10}  {m['total_bytes'] / GiB:6.2f} GiB {'fits' if m['fits'] else 'DOES NOT FIT'}  "
          f"step {1e3 * t['step_seconds']:8.1f} ms ({t['bound']}-bound, compute {1e3 * t['compute_seconds']:.1f} ms, "
          f"memory {1e3 * t['memory_seconds']:.1f} ms)  MFU bound {100 * t['mfu_bound']:3.0f}%"
          + (f" (HBM alone {100 * t['hbm_mfu_bound']:.0f}%)" if t.get("on_chip_bytes") else "")
          + f"  compiled in {r['compile_seconds']:.0f} s")

"""The device mesh, logical axis rules, and the shardings of train state and batches.

Model code names axes logically (`embed`, `activation_batch`, ...); `config.logical_axis_rules` maps
those names to the mesh axes `data`, `fsdp` and `tensor`. Nothing here knows about BERT.
"""

import math
from typing import Any, Mapping, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")   # a batch's leading dimension is split over both


def mesh_shape(mesh_config, num_devices: int) -> tuple[int, ...]:
  """Per-slice (ICI) mesh shape with its one -1 filled in, checked against `num_devices`.

  `num_devices` is the total device count; the `dcn_*` multipliers take their share first.
  """
  dcn = dcn_mesh_shape(mesh_config)
  per_slice, rem = divmod(num_devices, math.prod(dcn))
  if rem:
    raise ValueError(f"{num_devices} devices cannot be split into {math.prod(dcn)} slices (mesh.dcn_*={dcn})")
  shape = [int(mesh_config[a]) for a in MESH_AXES]
  if shape.count(-1) > 1:
    raise ValueError(f"at most one mesh axis may be -1, got {dict(zip(MESH_AXES, shape))}")
  if any(s == 0 or s < -1 for s in shape):
    raise ValueError(f"mesh axes must be positive or -1, got {dict(zip(MESH_AXES, shape))}")
  if -1 in shape:
    known = math.prod(s for s in shape if s != -1)
    if per_slice % known:
      raise ValueError(f"mesh {dict(zip(MESH_AXES, shape))} does not divide {per_slice} devices per slice")
    shape[shape.index(-1)] = per_slice // known
  if math.prod(shape) != per_slice:
    raise ValueError(
        f"mesh {dict(zip(MESH_AXES, shape))} needs {math.prod(shape)} devices per slice, "
        f"but there are {per_slice} ({num_devices} devices, {math.prod(dcn)} slices)")
  return tuple(shape)


def dcn_mesh_shape(mesh_config) -> tuple[int, ...]:
  return tuple(int(mesh_config.get(f"dcn_{a}", 1)) for a in MESH_AXES)


def create_mesh(mesh_config, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A Mesh with axes ("data", "fsdp", "tensor") from `config.mesh`; -1 fills, `dcn_*` spans slices."""
  devices = list(jax.devices() if devices is None else devices)
  ici = mesh_shape(mesh_config, len(devices))
  dcn = dcn_mesh_shape(mesh_config)
  try:
    if math.prod(dcn) > 1:
      grid = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices=devices)
    else:
      grid = mesh_utils.create_device_mesh(ici, devices=devices)
  except (NotImplementedError, ValueError, AssertionError):
    # Topology-aware placement is only known for TPUs (slices need `slice_index`): use device order,
    # each slice a contiguous block, so the dcn part of an axis is its outer (slowest) factor.
    blocks = np.asarray(devices).reshape(dcn + ici)
    grid = blocks.transpose(0, 3, 1, 4, 2, 5).reshape([d * i for d, i in zip(dcn, ici)])
  return Mesh(grid, MESH_AXES)


def logical_rules(config) -> tuple[tuple[str, Any], ...]:
  """`config.logical_axis_rules` as the tuple-of-pairs flax expects (lists from a config become tuples)."""
  return tuple((name, tuple(axes) if isinstance(axes, list) else axes)
               for name, axes in config.logical_axis_rules)


def uneven_axes(rules, sizes: Mapping[str, Sequence[int]], shape: Mapping[str, int]) -> list[str]:
  """Of `sizes` ({logical axis: its sizes}), those that `rules` (`logical_rules`) split over mesh axes whose
  product (their sizes in `shape`, slices included) does not divide them, as "vocab 257 over tensor (2)":
  jit refuses such an uneven sharding, and only once the first step compiles."""
  rules, problems = dict(rules), []
  for name, ns in sizes.items():
    axes = rules.get(name)
    axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
    ways = math.prod(shape[a] for a in axes)
    problems += [f"{name} {n} over {' x '.join(axes)} ({ways})" for n in ns if n % ways]
  return problems


def data_parallel_size(mesh: Mesh) -> int:
  """How many ways a batch's leading dimension is split."""
  return math.prod(mesh.shape[a] for a in BATCH_AXES)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) dimension over data+fsdp, everything else replicated."""
  return NamedSharding(mesh, PartitionSpec(BATCH_AXES))


def logical_to_shardings(logical_specs: Any, mesh: Mesh, rules) -> Any:
  """A tree of logical PartitionSpecs (from `nn.get_partition_spec`) -> NamedShardings."""
  return nn.logical_to_mesh_sharding(logical_specs, mesh, rules)


def global_batch(host_batch: Mapping[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """This host's rows -> global arrays sharded over the batch axes (every host calls this)."""
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v)) for k, v in host_batch.items()}

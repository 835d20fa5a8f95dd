"""Gather a sharded weight once per step: the forward pass's gathered copy is kept for the backward pass.

Under FSDP (`embed` -> `fsdp` in `config.logical_axis_rules`) each matmul's weight is sharded over the
fsdp axis, and XLA's partitioner gathers it where a matmul uses it. In the steps compiled for TPU v3 it
gathers it twice: in the forward pass and again in the backward pass, where the input's gradient multiplies
by the same weight (and under a remat policy the recomputation gathers it again).
`BertConfig.reshard_after_forward` False (PyTorch FSDP's `reshard_after_forward=False`, ZeRO's stage 2
against stage 3) all-gathers the compute-dtype weight right after its cast, in a `shard_map` over its mesh
axes, into its layout without the fsdp and data axes: one all-gather a weight a step, whose copy both passes
read, for the memory of every layer's gathered weights held from the forward pass to the backward pass.

The weight's gradient passes the gather as it comes (`custom_vjp`), constrained to the weight's sharding:
the partitioner reduce-scatters the partial sums onto the shards there, in the gathered array's shape, before
any reshape between it and the parameter (`projections.Einsum`'s [H, N * K] matrices of [H, N, K] kernels:
reduce-scattered after the reshape, the gradient was written and read in the padded 3-D layout; BERT-large
phase 1 on v3:8x8 with 4 layers: 1.216 -> 1.179 GB a core). (The shard_map's own transpose would all-reduce
them first; a sharding constraint in place of the shard_map made XLA transpose the gathered weights with
copies.) Under a remat policy the gathered weight is named `GATHERED`, and
`BertConfig.remat_checkpoint_policy` keeps it.

It applies to the projections' kernels (attention, feed-forward, the heads' dense layers; in looped
layers the attention kernels only, `projections.dense`); the embedding tables (`nn.Embed`, and the MLM
decoder tied to the word embeddings) are gathered as XLA chooses.

Numerically the identity: the same bfloat16 (or float32) weight either way.
"""

import math

import flax.linen as nn
import jax
from jax.ad_checkpoint import checkpoint_name

from bert_jax import sharding

GATHERED = "gathered_weight"


def _gather_dims(spec) -> list[tuple[int, tuple[str, ...]]]:
  """(dimension, its batch mesh axes) of each dimension of `spec` sharded over batch axes alone."""
  dims = []
  for d, axes in enumerate(spec):
    axes = axes if isinstance(axes, tuple) else (axes,)
    batch = tuple(a for a in axes if a in sharding.BATCH_AXES)   # what the gathered layout drops
    if batch and len(batch) != len(axes):
      raise ValueError(f"reshard_after_forward=False: dimension {d} of a weight is sharded over {axes}, batch "
                       f"and other mesh axes together; map it to one kind in config.logical_axis_rules")
    if batch:
      dims.append((d, batch))
  return dims


def gathered(w: jax.Array, names: tuple) -> jax.Array:
  """`w` (logical axes `names`, after its cast to the compute dtype) all-gathered over the fsdp and data mesh
  axes, for both passes: a `shard_map`, whose gradient is the identity on the (global) array, left for the
  partitioner to reduce-scatter. Unchanged outside an abstract-mesh and logical-axis-rules context (plain
  apply) or where no such axis shards it."""
  rules, mesh = nn.get_logical_axis_rules(), jax.sharding.get_abstract_mesh()
  if not rules or mesh.empty:
    return w
  spec = nn.logical_to_mesh_axes(names, rules)
  dims = [(d, axes) for d, axes in _gather_dims(spec) if math.prod(mesh.shape[a] for a in axes) > 1]
  if not dims:
    return w
  gathered_spec = jax.sharding.PartitionSpec(*(None if any(d == g for g, _ in dims) else a
                                               for d, a in enumerate(spec)))

  def gather(shard):
    for d, axes in dims:
      shard = jax.lax.all_gather(shard, axes if len(axes) > 1 else axes[0], axis=d, tiled=True, to="invarying")
    return shard

  # The gradient passes through as it comes (partial sums over the batch shards), reduce-scattered by the
  # partitioner onto `w`'s shards right here. The shard_map's own transpose would all-reduce it first.
  shard_mapped = jax.shard_map(gather, mesh=mesh, in_specs=spec, out_specs=gathered_spec)

  @jax.custom_vjp
  def gather_forward(x):
    return shard_mapped(x)
  sharded = jax.sharding.NamedSharding(mesh, spec)
  gather_forward.defvjp(lambda x: (shard_mapped(x), None), lambda _, g: (jax.lax.with_sharding_constraint(g, sharded),))
  return checkpoint_name(gather_forward(w), GATHERED)


def dot_general(names: tuple):
  """A `lax.dot_general` for `nn.Dense(dot_general=...)` whose right operand (the kernel, logical axes
  `names`) is `gathered` first."""
  def dot(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, **kwargs):
    return jax.lax.dot_general(lhs, gathered(rhs, names), dimension_numbers, precision=precision,
                               preferred_element_type=preferred_element_type, **kwargs)
  return dot

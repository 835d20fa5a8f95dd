"""The word-embedding lookup on each device's own shard of the table.

Under FSDP the word-embedding table [V, E] is split by columns over the fsdp axis (`embed` -> `fsdp` in
`config.logical_axis_rules`, and by rows over `tensor` where `vocab` -> `tensor`). Left to XLA's
partitioner, `jnp.take` all-gathers the table for the forward pass, and its transpose scatters every
token's gradient into a zeroed copy of the whole table on every device, then all-reduces that copy: on
BERT-large's v5e:8x8 step (2 x 32 x 1) about 0.44 GB a device a step for a table whose shard is 4 MB
in float32 (docs/performance.md).

`lookup` does it in a `shard_map` instead: each device gathers the token ids of its fsdp group's rows of
the batch (integers), looks them up in its own [V / tensor, E / fsdp] shard (rows outside its vocabulary slice are
zeros, summed over `tensor`), and an all-to-all over fsdp trades row blocks for column blocks, so that each
device ends with the whole width for its own tokens. The transpose is the same in reverse: an all-to-all
of the embeddings' gradient and a scatter-add into the shard (float32, as the parameter), summed over the
data axis that replicates it. No array of the table's full size is made.

The rows are read from the float32 table and cast to the compute dtype after the lookup, which is the
same as casting the table first; the gradient is accumulated in float32 (XLA's path accumulates it in
the compute dtype). Outside a mesh-and-rules context, or for a layout it does not cover (the columns not
split over a batch axis, a batch the mesh does not divide, as at init), it is `jnp.take`.

`BertConfig.embedding_lookup_on_shards` turns it on. Whether it pays depends on the chip's tiles: the
shard's few columns (E / fsdp: 16 at fsdp 64) are padded to the TPU's 128 lanes in every array of the
lookup, which on v3:8x8 costs more bytes by XLA's count than the table-sized gradient saves
(docs/performance.md).
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax import sharding

TABLE_AXES = ("vocab", "embed")
IDS_AXES = ("activation_batch", "activation_length")
OUT_AXES = ("activation_batch", "activation_length", "activation_embed")


def _single(axes):
  """The one mesh axis name of a PartitionSpec entry, None when unsharded; False for several."""
  if axes is None:
    return None
  if isinstance(axes, tuple):
    return axes[0] if len(axes) == 1 else False
  return axes


def _plan(table_shape, ids_shape, mesh, rules):
  """(vocab axis or None, fsdp axis, specs) when the sharded lookup applies, else None."""
  table_spec = nn.logical_to_mesh_axes(TABLE_AXES, rules)
  ids_spec = nn.logical_to_mesh_axes(IDS_AXES, rules)
  out_spec = nn.logical_to_mesh_axes(OUT_AXES, rules)
  vocab_axis, embed_axis = _single(table_spec[0]), _single(table_spec[1])
  batch = ids_spec[0] if isinstance(ids_spec[0], tuple) else (ids_spec[0],)
  if (vocab_axis is False or not embed_axis or embed_axis not in batch or vocab_axis in sharding.BATCH_AXES
      or vocab_axis in batch   # the psum over the vocabulary slices would add up different tokens' rows
      or tuple(out_spec) != tuple(ids_spec) + (None,) or mesh.shape[embed_axis] == 1
      or table_shape[1] % mesh.shape[embed_axis] or (vocab_axis and table_shape[0] % mesh.shape[vocab_axis])
      or len(ids_shape) != 2 or ids_shape[0] % math.prod(mesh.shape[a] for a in batch)):   # (init: one row)
    return None
  return vocab_axis, embed_axis, (table_spec, ids_spec, out_spec)


def lookup(table_VE: jax.Array, ids_BL: jax.Array, dtype) -> jax.Array:
  """table[ids] in `dtype`: [B, L, E] (module docstring)."""
  rules, mesh = nn.get_logical_axis_rules(), jax.sharding.get_abstract_mesh()
  plan = None if not rules or mesh.empty else _plan(table_VE.shape, ids_BL.shape, mesh, rules)
  if plan is None:
    return jnp.take(table_VE, ids_BL, axis=0).astype(dtype)
  vocab_axis, embed_axis, (table_spec, ids_spec, out_spec) = plan

  def local(shard_VE, ids):
    ids = jax.lax.all_gather(ids, embed_axis, axis=0, tiled=True)   # the fsdp group's tokens
    if vocab_axis is None:
      rows = jnp.take(shard_VE, ids, axis=0)
    else:   # this device's slice of the vocabulary; the other slices' rows come from the psum
      rows_here = shard_VE.shape[0]
      index = ids - jax.lax.axis_index(vocab_axis) * rows_here
      inside = (index >= 0) & (index < rows_here)
      rows = jnp.where(inside[..., None], jnp.take(shard_VE, jnp.clip(index, 0, rows_here - 1), axis=0), 0)
      rows = jax.lax.psum(rows, vocab_axis)
    # [fsdp x b, L, E / fsdp] -> [b, L, E]: each device keeps its own tokens, with every column block.
    return jax.lax.all_to_all(rows.astype(dtype), embed_axis, split_axis=0, concat_axis=2, tiled=True)

  return jax.shard_map(local, mesh=mesh, in_specs=(table_spec, ids_spec), out_specs=out_spec)(table_VE, ids_BL)

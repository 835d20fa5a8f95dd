"""The MLM decoder tied to the word embeddings, and its cross-entropy, on each device's slice of the vocabulary.

Under FSDP the word-embedding table [V, E] is split by columns over the fsdp axis (`embed` -> `fsdp` in
`config.logical_axis_rules`, and by rows over `tensor` where `vocab` -> `tensor`). `tied_decoder.tied_logits`
on the sharded table makes XLA's partitioner all-gather it on every device in the compute dtype ([V / tensor,
E]: 32 MB a core for BERT-large on v3:8x8 phase 1), read it in both passes, write the table's whole
gradient and reduce-scatter it: about 175 MB a core a step by op there, for the 80 masked rows a core
(docs/performance.md).

`masked_lm_sums` does it in a `shard_map` instead. Each device pads its shard's rows to a multiple of the
fsdp size and trades column blocks for row blocks with an all-to-all over fsdp, so that it holds whole
rows of its own slice of the vocabulary, [V / (tensor * fsdp), E] (the padding: at most fsdp - 1 rows of
zeros a tensor slice, whose logits get a bias of -1e9). The masked rows of the fsdp group are gathered
([rows / data, E]: the masked positions' vectors, not the table), each device takes the logits of its
slice through `tied_logits`, and the cross-entropy's reductions over the vocabulary become psums
over the slices: the max, the sum of exponentials, the label's logit; argmax's first index of the max
is a pmin of each slice's first. No logits leave the devices. In the backward pass the rows' gradient is
reduce-scattered over fsdp before it is summed over tensor, and the table's goes back through the
all-to-all onto the shard.

Where the tensor axis divides a device's masked rows, the rows are split over it as well: each tensor slice
takes its share of every device's rows and gathers the other slices' vocabulary rows of its fsdp slot
([tensor * V / (tensor * fsdp), E], all-gathered over tensor), so the psums run over fsdp alone. A device
then reads [rows / tensor, E] of activations against [V / fsdp, E] of the table in each of the three
matmuls, where it read [rows, E] against [V / (tensor * fsdp), E]: for BERT-large phase 1 on v3:8x8 (5,120
masked rows a step, fsdp 64, tensor 2) 2,560 rows against 478 of the vocabulary instead of 5,120 against
239, 16 MB a core a step fewer by op. Each device's results come back from the slices that took its rows
(an all-gather over tensor of [rows / tensor]).

Numerically it is `objectives.base.cross_entropy_sums` on `tied_logits`: the same products in the same
dtypes, the sums over the vocabulary in another order (`tests/test_vocab_split.py` compares losses and
gradients). Outside a mesh-and-rules context, or for a layout it does not cover (the table's columns not
split over a batch axis of the rows, a vocabulary the tensor axis does not divide, rows the mesh does not
divide, as at init), it returns None and the caller takes the logits.

`BertConfig.decoder_on_shards` turns it on for the masked LM head of `heads.BertForPreTraining`.
"""

import functools
import math
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax import sharding
from bert_jax.models import embedding_lookup
from bert_jax.models.tied_decoder import tied_logits

TABLE_AXES = embedding_lookup.TABLE_AXES
ROWS_AXES = ("activation_batch", None, "activation_embed")
PAD_BIAS = -1e9   # the logit of a padding row: exp() of it, shifted by any real logit, is 0 in float32


def _plan(table_shape, rows_shape, mesh, rules):
  """(vocab axis or None, fsdp axis, batch axes, specs) when the split decoder applies, else None."""
  table_spec = nn.logical_to_mesh_axes(TABLE_AXES, rules)
  rows_spec = nn.logical_to_mesh_axes(ROWS_AXES, rules)
  vocab_axis, embed_axis = embedding_lookup._single(table_spec[0]), embedding_lookup._single(table_spec[1])
  batch = rows_spec[0] if isinstance(rows_spec[0], tuple) else (rows_spec[0],)
  if (vocab_axis is False or not embed_axis or embed_axis not in batch or vocab_axis in sharding.BATCH_AXES
      or vocab_axis in batch   # the slices' psums would add up different rows
      or rows_spec[2] is not None or mesh.shape[embed_axis] == 1 or table_shape[1] % mesh.shape[embed_axis]
      or (vocab_axis and table_shape[0] % mesh.shape[vocab_axis]) or len(rows_shape) != 3
      or rows_shape[0] % math.prod(mesh.shape[a] for a in batch)):
    return None
  spec = jax.sharding.PartitionSpec
  return vocab_axis, embed_axis, batch, (table_spec, spec(table_spec[0]), spec(batch, None, None), spec(batch, None))


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _gather_rows(x, axis):
  """The rows of every device on `axis`, tiled; their gradient reduce-scattered back, as a TPU does it over
  the leading (major) dimension of a 2-D array."""
  return jax.lax.all_gather(x, axis, axis=0, tiled=True)


_gather_rows.defvjp(lambda x, axis: (_gather_rows(x, axis), None),
                    lambda axis, _, d_x: (jax.lax.psum_scatter(d_x, axis, scatter_dimension=0, tiled=True),))


def _device_rows(shard_VE, bias_V, embed_axis, padded: int, per_device: int):
  """(rows, bias, slot): whole rows of this device's slice of the vocabulary, [padded, E / fsdp] padded
  with zero rows -> [per_device, E], their float32 bias (PAD_BIAS in the padding), and the device's place on
  `embed_axis`."""
  shard_VE = jnp.pad(shard_VE, ((0, padded - shard_VE.shape[0]), (0, 0)))
  rows_VE = jax.lax.all_to_all(shard_VE, embed_axis, split_axis=0, concat_axis=1, tiled=True)
  slot = jax.lax.axis_index(embed_axis)
  bias_V = jnp.pad(bias_V.astype(jnp.float32), (0, padded - bias_V.shape[0]), constant_values=PAD_BIAS)
  return rows_VE, jax.lax.dynamic_slice_in_dim(bias_V, slot * per_device, per_device), slot


class _Columns(NamedTuple):
  """Which vocabulary rows a device's logits hold: column j is row
  (chunk + j // per_device) * per_tensor + slot * per_device + j % per_device, for j < slices * per_device."""
  chunk: jax.Array        # the first tensor slice of the vocabulary the columns cover
  slot: jax.Array         # the device's place on the fsdp axis
  per_tensor: int         # vocabulary rows of a tensor slice
  per_device: int         # of them, a device's (the slice padded to a multiple of the fsdp axis)
  slices: int             # tensor slices the columns cover

  def of_labels(self, labels_N):
    """The column of each label, -1 where another device holds it. A label past a tensor slice's real rows
    belongs to the next slice, not to this one's padding."""
    piece = labels_N // self.per_tensor - self.chunk
    offset = labels_N % self.per_tensor - self.slot * self.per_device
    inside = (piece >= 0) & (piece < self.slices) & (offset >= 0) & (offset < self.per_device)
    return jnp.where(inside, piece * self.per_device + offset, -1)

  def row(self, column):
    return (self.chunk + column // self.per_device) * self.per_tensor + self.slot * self.per_device + (
        column % self.per_device)


def _nll_and_correct(logits, labels_N, columns: _Columns, reduce_axes) -> tuple[jax.Array, jax.Array]:
  """(-log p(label), 1.0 where argmax == label else 0.0) of rows whose logits are split over `reduce_axes`,
  each device's `columns` of them; the first of tied maxima over the whole vocabulary, as `jnp.argmax`."""
  index = columns.of_labels(labels_N)
  iota = jax.lax.broadcasted_iota(index.dtype, logits.shape, 1)
  label_logit = jax.lax.psum(jnp.sum(jnp.where(iota == index[:, None], logits, 0.0), axis=-1), reduce_axes)
  top = jax.lax.stop_gradient(jnp.max(logits, axis=-1))
  shift = jax.lax.pmax(top, reduce_axes)
  nll = jnp.log(jax.lax.psum(jnp.sum(jnp.exp(logits - shift[:, None]), axis=-1), reduce_axes)) + shift - label_logit
  best = columns.row(jnp.argmax(logits, axis=-1).astype(index.dtype))
  argmax = jnp.where(top == shift, best, jnp.iinfo(index.dtype).max)
  return nll, (jax.lax.pmin(argmax, reduce_axes) == labels_N).astype(jnp.float32)


def masked_lm_sums(x_BPE, table_VE, bias_V, labels_BP, library: bool = False):
  """(-log p(label), 1.0 where argmax == label else 0.0), each [B, P] float32, of the logits x @ table^T + bias;
  None where the layout is not covered (module docstring). x and the table in the compute dtype."""
  rules, mesh = nn.get_logical_axis_rules(), jax.sharding.get_abstract_mesh()
  plan = None if not rules or mesh.empty else _plan(table_VE.shape, x_BPE.shape, mesh, rules)
  if plan is None:
    return None
  vocab_axis, embed_axis, batch, (table_spec, bias_spec, rows_spec, out_spec) = plan
  fsdp, tensor = mesh.shape[embed_axis], mesh.shape[vocab_axis] if vocab_axis else 1
  vocab_axes = (vocab_axis, embed_axis) if vocab_axis else (embed_axis,)
  others = tuple(a for a in batch if a != embed_axis)
  per_tensor = table_VE.shape[0] // tensor
  padded = -(-per_tensor // fsdp) * fsdp
  per_device = padded // fsdp
  rows_local = x_BPE.shape[0] // math.prod(mesh.shape[a] for a in batch) * x_BPE.shape[1]
  split_rows = tensor > 1 and rows_local % tensor == 0
  slices = tensor if split_rows else 1    # tensor slices of the vocabulary a device's logits cover
  reduce_axes = (embed_axis,) if split_rows else vocab_axes

  def local(x_BPE, shard_VE, bias_V, labels_BP):
    b, p, e = x_BPE.shape
    m = b * p // slices    # the rows this device takes of its own: all, or its tensor slice's share
    rows_VE, bias_V, slot = _device_rows(shard_VE, bias_V, embed_axis, padded, per_device)
    x_ME, labels_M = x_BPE.reshape(b * p, e), labels_BP.reshape(b * p)
    if vocab_axis:   # x is the same on every tensor slice; its gradient is summed over them
      x_ME = jax.lax.pcast(x_ME, vocab_axis, to="varying")
    if split_rows:   # each tensor slice takes 1 / tensor of the rows against this slot's rows of every slice
      t = jax.lax.axis_index(vocab_axis)
      x_ME = jax.lax.dynamic_slice_in_dim(x_ME, t * m, m)
      labels_M = jax.lax.dynamic_slice_in_dim(jax.lax.pcast(labels_M, vocab_axis, to="varying"), t * m, m)
      rows_VE, bias_V = (jax.lax.all_gather(a, vocab_axis, axis=0, tiled=True) for a in (rows_VE, bias_V))
      chunk = jnp.zeros((), jnp.int32)
    else:
      chunk = jax.lax.axis_index(vocab_axis) if vocab_axis else jnp.zeros((), jnp.int32)
    # The fsdp group's rows, 2-D: a TPU reduce-scatters their gradient over its leading (major) dimension.
    x_NE = _gather_rows(x_ME, embed_axis)
    labels_N = jax.lax.all_gather(labels_M, embed_axis, axis=0, tiled=True, to="invarying")
    if others:   # the rows differ over the other batch axes: the slice's gradients are summed over them
      rows_VE, bias_V = (jax.lax.pcast(a, others, to="varying") for a in (rows_VE, bias_V))
    logits = tied_logits(x_NE, rows_VE, bias_V, library)            # [N, slices * V / devices] float32
    columns = _Columns(chunk, slot, per_tensor, per_device, slices)
    nll, correct = _nll_and_correct(logits, labels_N.astype(jnp.int32), columns, reduce_axes)
    own = lambda a: jax.lax.dynamic_slice_in_dim(a, slot * m, m)   # noqa: E731
    nll, correct = own(nll), own(correct)
    if split_rows:   # the device's rows back from the tensor slices that took them
      nll, correct = (jax.lax.all_gather(a, vocab_axis, axis=0, tiled=True, to="invarying") for a in (nll, correct))
    return nll.reshape(b, p), correct.reshape(b, p)

  return jax.shard_map(local, mesh=mesh, in_specs=(rows_spec, table_spec, bias_spec, out_spec),
                       out_specs=(out_spec, out_spec))(x_BPE, table_VE, bias_V, labels_BP)

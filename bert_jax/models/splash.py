"""Attention through Pallas' splash kernel (TPU): no [B, N, L, L] scores in memory.

`jax.nn.dot_product_attention` with a dense mask lets XLA pick its implementation, and on TPU XLA
materialises the float32 scores: 8192 tokens x 12 heads is 3.2 GB per sequence and layer. The splash
kernel (`jax.experimental.pallas.ops.tpu.splash_attention`) streams blocks of keys instead and skips the
blocks a mask rules out, so a sliding window of 128 tokens costs 128, not 8192, keys per query.

The masks it takes are the encoder's (`encoder.attention_mask`), expressed as the kernel wants them:
- packing and padding as segment ids: 0 for padding, 1 + the packed example's id for real tokens; a query
  attends to keys of its own segment (padding attends to padding, whose outputs nothing reads);
- a sliding window of `window` tokens (`window // 2` on either side, Hugging Face's ModernBERT) as a
  `LocalMask`, causality as a `CausalMask`.

`BertConfig.attention_kernel` chooses: "xla" (the dense mask, any backend); "splash": the kernel where the
step is lowered for TPU (what `bert-jax aot` compiles from a CPU host), XLA's attention under the same mask
on other platforms (`lax.platform_dependent`), so one config runs everywhere; "splash_interpret": the
kernel run by Pallas' interpreter on any backend (slow: tests). Queries are scaled by 1/sqrt(head_dim)
before the kernel (it does not scale). Under a mesh the kernel runs per shard (`jax.shard_map`): batch and
heads may be sharded, the sequence may not.
"""

from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as kernel_lib
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as mask_lib

from bert_jax.models.config import ATTENTION_KERNELS
BLOCKS = (512, 256, 128)   # query and key blocks, the largest that tiles the sequence


@flax.struct.dataclass
class SegmentMask:
  """What the splash kernel reads instead of a dense mask. `local`: this layer uses the window (a Python
  bool, or a traced one under nn.scan, where both kernels are compiled and `lax.cond` picks)."""
  segment_ids: jax.Array                                      # [B, L] int32, 0 = padding
  local: Any = False
  window: int | None = flax.struct.field(pytree_node=False, default=None)
  causal: bool = flax.struct.field(pytree_node=False, default=False)
  interpret: bool = flax.struct.field(pytree_node=False, default=False)


def segment_mask(kernel: str, input_mask, example_ids=None, window=None, causal=False) -> SegmentMask:
  """The `SegmentMask` of an encoder input: `input_mask` [B, L] (1 = real), `example_ids` [B, L] or None."""
  if kernel not in ATTENTION_KERNELS[1:]:
    raise ValueError(f"attention_kernel {kernel!r} has no segment mask; one of {ATTENTION_KERNELS[1:]}")
  ids = jnp.zeros(input_mask.shape, jnp.int32) if example_ids is None else example_ids.astype(jnp.int32)
  segment_ids = jnp.where(input_mask.astype(bool), ids + 1, 0)
  return SegmentMask(segment_ids, window=window, causal=causal, interpret=kernel.endswith("_interpret"))


def check_length(length: int):
  """Raise unless the kernel's blocks tile a sequence of `length` tokens."""
  if length % BLOCKS[-1]:
    raise ValueError(f"attention_kernel 'splash' needs a sequence length that is a multiple of {BLOCKS[-1]}; "
                     f"got {length}: use attention_kernel 'xla'")


def block_size(length: int) -> int:
  """The query and key block the kernel uses for a sequence of `length` tokens (`check_length` first)."""
  return next(b for b in BLOCKS if length % b == 0)


def _kernel(num_heads: int, length: int, window: int | None, causal: bool, interpret: bool):
  """A splash kernel for one example's [num_heads, length, head_dim] queries, keys and values."""
  shape = (length, length)
  if window is not None:
    base = mask_lib.LocalMask(shape, (window // 2, 0 if causal else window // 2), offset=0)
  elif causal:
    base = mask_lib.CausalMask(shape)
  else:
    base = mask_lib.FullMask(shape)
  block = block_size(length)
  sizes = kernel_lib.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                                block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block,
                                block_kv_dq=block)
  return kernel_lib.make_splash_mha(mask_lib.MultiHeadMask([base] * num_heads), block_sizes=sizes,
                                    head_shards=1, q_seq_shards=1, interpret=interpret)


def attention(q_BLNK, k_BLNK, v_BLNK, mask: SegmentMask):
  """softmax(q k / sqrt(head_dim)) v over the keys `mask` allows, [B, L, N, K] in and out: the splash kernel
  where the step is lowered for TPU (or interpreted), XLA's attention under the same mask elsewhere."""
  check_length(q_BLNK.shape[1])
  if mask.interpret:
    return _splash(q_BLNK, k_BLNK, v_BLNK, mask.segment_ids, jnp.asarray(mask.local), mask)
  return jax.lax.platform_dependent(
      q_BLNK, k_BLNK, v_BLNK, mask.segment_ids, jnp.asarray(mask.local),
      tpu=lambda *a: _splash(*a, mask), default=lambda *a: _dense(*a, mask))


def dense_mask(segment_ids, local, mask: SegmentMask):
  """The boolean [B, 1, L, L] mask the kernel applies: same segment (padding with padding), and for a local
  layer within the window, causal if asked."""
  allowed = segment_ids[:, :, None] == segment_ids[:, None, :]
  position = jnp.arange(segment_ids.shape[-1])
  if mask.causal:
    allowed &= position[:, None] >= position[None, :]
  if mask.window is not None:
    allowed &= jnp.logical_not(local) | (jnp.abs(position[:, None] - position[None, :]) <= mask.window // 2)
  return allowed[:, None]


def _dense(q_BLNK, k_BLNK, v_BLNK, segment_ids, local, mask: SegmentMask):
  return jax.nn.dot_product_attention(q_BLNK, k_BLNK, v_BLNK, mask=dense_mask(segment_ids, local, mask))


def _splash(q_BLNK, k_BLNK, v_BLNK, segment_ids, local, mask: SegmentMask):
  scale = np.asarray(1.0 / np.sqrt(q_BLNK.shape[-1]), q_BLNK.dtype)
  q, k, v = (x.transpose(0, 2, 1, 3) for x in (q_BLNK * scale, k_BLNK, v_BLNK))   # [B, N, L, K]
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    o = _shard(q, k, v, segment_ids, local, mask)
  else:
    spec = fitting(mesh, q.shape, nn.logical_to_mesh_axes(
        ("activation_batch", "activation_heads", "activation_length", "activation_kv")))
    if spec[2] is not None or spec[3] is not None:
      raise ValueError(f"attention_kernel 'splash' shards batch and heads only; the logical axis rules shard "
                       f"the sequence or the head dimension ({spec})")
    segment_spec = jax.sharding.PartitionSpec(spec[0], None)
    # The local flag may be traced (nn.scan): it enters the shard_map as a replicated operand.
    o = jax.shard_map(lambda q, k, v, s, local: _shard(q, k, v, s, local, mask), mesh=mesh,
                      in_specs=(spec, spec, spec, segment_spec, jax.sharding.PartitionSpec()), out_specs=spec,
                      check_vma=False)(q, k, v, segment_ids, local)
  return o.transpose(0, 2, 1, 3)


def fitting(mesh, shape, spec):
  """`spec` with the axes that do not divide their dimension left unsharded (e.g. the one row that
  initialisation traces)."""
  def size(axes):
    return int(np.prod([mesh.shape[a] for a in ((axes,) if isinstance(axes, str) else axes)]))
  return jax.sharding.PartitionSpec(*(None if axes is None or n % size(axes) else axes
                                      for n, axes in zip(shape, tuple(spec) + (None,) * len(shape))))


def _shard(q, k, v, segment_ids, local, mask: SegmentMask):
  """The kernel on one shard's [B, N, L, K] arrays (already scaled); `local` a bool or a traced one."""
  def run(window, q, k, v, segment_ids):
    kernel = _kernel(q.shape[1], q.shape[2], window, mask.causal, mask.interpret)
    return jax.vmap(kernel)(q, k, v, segment_ids=kernel_lib.SegmentIds(segment_ids, segment_ids))

  static = mask.local if isinstance(mask.local, bool) else None   # None: traced, `local` decides
  if mask.window is None or static is False:
    return run(None, q, k, v, segment_ids)
  if static:
    return run(mask.window, q, k, v, segment_ids)
  return jax.lax.cond(local, lambda *a: run(mask.window, *a), lambda *a: run(None, *a), q, k, v, segment_ids)

"""BERT's training attention, dropout included, as one Pallas TPU kernel: no [B, N, L, L] array in HBM.

The explicit path (`softmax_dropout.attend`) writes the scores (float32 or bfloat16), keeps the
probabilities and the dropout mask for the backward pass and writes the scores' gradient: at sequence 512
that is most of a BERT layer's bytes (docs/performance.md). The splash kernel keeps scores on chip but has no dropout. Here
each (example, head, block of queries) computes its scores against every key of the sequence in VMEM,
softmax, dropout and the weighted sum; the backward kernel recomputes them (no residual but q, k and v) and
gives the gradients of queries, keys and values. HBM sees q, k, v, the output and their gradients only.

Dropout bits: a counter hash, not `jax.random`. Per example and head the step's dropout key gives two
32-bit seeds (`seeds`, drawn from it); `_mix(_mix(index + seed0) ^ seed1)` (`_mix`: Bob Jenkins' 32-bit integer
hash, shifts, adds and xors) of `index = query * L/2 + key` gives 16 bits to the score of `key` and 16 to
that of `key + L/2`. A score is kept when its 16 bits are at least `rate * 2^16` (rounded: 0.1 keeps
0.899994). The kernel hashes on the vector units, and `keep_mask` makes the same bits with XLA ops, so the
dense path (`reference`, other backends) and the kernel drop the same scores, on any mesh (seeds are per
example and head and shard with them). The bits differ from `nn.Dropout`'s (threefry), so a step's loss
equals the explicit path's without dropout only; with dropout it is a different draw. With `bits`
"hardware" (`BertConfig.flash_bits`) the TPU kernel draws from the TPU's hardware generator instead
(`pltpu.prng_random_bits`, seeded by the same seeds and the block of queries): fewer vector ops (`bert-jax
bench kernel --bits=hardware`), the same bits in the forward and backward kernels and in a resumed run, but
not the other backends' (which keep the hash, as the interpreter does: its generator gives zeros).

`BertConfig.attention_kernel` "flash" runs the kernel where the step is lowered for TPU and `reference`
elsewhere (`lax.platform_dependent`); "flash_interpret" runs the kernel in Pallas' TPU interpreter on any
backend (tests; slow). Masks are segment ids (`splash.SegmentMask`: padding and packed examples); windows
and causality are splash's. Sequences up to `MAX_LENGTH`: a block of queries (512 up to 1,024 tokens, else
128) holds its scores against all keys.
"""

import contextlib
import contextvars
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from flax import linen as nn

from bert_jax.models import dropout
from bert_jax.models import softmax_dropout
from bert_jax.models import splash

MAX_LENGTH = 2048
# TPU generations whose Mosaic matmuls take float32 operands only (bfloat16 fails to compile): the kernel
# gives them its bfloat16 values as float32, at default precision. That compiles to one MXU pass of f32-format
# pushes (`llo.vmatmul`, mode "round"), the form XLA's own bfloat16 matmuls take on v3 (`vmatmul.f32`), not
# the six of HIGHEST (tests/test_aot.py reads it from the Mosaic compiler's dump).
FLOAT32_MATMULS = ("TPU v2", "TPU v3")
_device_kind = contextvars.ContextVar("flash_dropout_device_kind", default="")
NT = (((1,), (1,)), ((), ()))   # a @ b.T
NN = (((1,), (0,)), ((), ()))   # a @ b


def check_length(length: int, rate: float = 0.0) -> str | None:
  """Why the kernel cannot take sequences of `length` tokens (with dropout at `rate`), or None."""
  if length > MAX_LENGTH:
    return (f"attention_kernel 'flash' holds a query block's scores against all {length} keys; it takes "
            f"sequences up to {MAX_LENGTH}")
  if length > 1024 and length % 128:
    return f"attention_kernel 'flash' tiles sequences above 1,024 tokens in blocks of 128; got {length}"
  if rate > 0 and length % 2:
    return f"attention_kernel 'flash' with dropout takes even sequence lengths; got {length}"
  return None


def block_q(length: int, rate: float = 0.0) -> int:
  """Queries per kernel step: [length, block] float32 arrays live in VMEM at once (the whole sequence for
  one that no block divides, up to 1,024 tokens). Raises `check_length`'s problem."""
  if problem := check_length(length, rate):
    raise ValueError(problem)
  for block in ((512, 256, 128) if length <= 1024 else (128,)):
    if length % block == 0:
      return block
  return length


@contextlib.contextmanager
def compiling_for(device_kind: str):
  """Trace the kernel for devices of `device_kind` (`jax.Device.device_kind`, e.g. "TPU v3")."""
  token = _device_kind.set(device_kind)
  try:
    yield
  finally:
    _device_kind.reset(token)


def matmul_dtype(dtype):
  """The dtype the kernel's matmuls take for inputs of `dtype` on the devices traced for (`compiling_for`;
  without it, this process's TPU, if it has one)."""
  kind = _device_kind.get() or (jax.devices()[0].device_kind if jax.default_backend() == "tpu" else "")
  return jnp.dtype(jnp.float32) if kind.startswith(FLOAT32_MATMULS) else jnp.dtype(dtype)


def seeds(key, batch: int, heads: int):
  """Two int32 seeds per example and head [B, N, 2] from the dropout key."""
  return lax.bitcast_convert_type(jax.random.bits(key, (batch, heads, 2), jnp.uint32), jnp.int32)


# The hash and its threshold are the encoder's "hash" dropout bits' (models/dropout.py), one owner.
_shift, _int32, _mix, _threshold = dropout.shift, dropout.int32, dropout.mix, dropout.threshold


def _bits(index, seed0, seed1):
  """Two scores' 16 bits each, [low, high], from one hash of `index`."""
  h = _mix(_mix(index + seed0) ^ seed1)
  return h & jnp.int32(0xFFFF), _shift(h, 16)


def keep_mask(seeds_BN2, length: int, rate: float):
  """The kernel's dropout bits with XLA ops: [B, N, L, L] bool, True where a score is kept. A hash of
  `query * (L / 2) + key` gives keys `key` (low 16 bits) and `key + L / 2` (high)."""
  block_q(length, rate)
  half = length // 2
  index = jnp.arange(length, dtype=jnp.int32)[:, None] * half + jnp.arange(half, dtype=jnp.int32)[None]
  low, high = _bits(index[None, None], seeds_BN2[..., 0, None, None], seeds_BN2[..., 1, None, None])
  return jnp.concatenate([low, high], axis=-1) >= _threshold(rate)


def reference(q, k, v, segment_ids, seeds_BN2, rate: float):
  """The kernel's function with XLA ops ([B, L, N, K] in and out): `softmax_dropout`'s explicit path with
  `keep_mask`'s bits."""
  probs = softmax_dropout.probabilities(q, k, splash.dense_mask(segment_ids, False, splash.SegmentMask(segment_ids)))
  if rate > 0:
    probs = jnp.where(keep_mask(seeds_BN2, q.shape[1], rate), probs / (1.0 - rate), 0.0)
  return jnp.einsum("bnqs,bsnk->bqnk", probs.astype(v.dtype), v)


# The kernels work on one (example, head)'s keys [L, K] against a block of queries [bq, K], with the
# scores transposed, [L, bq]: keys in sublanes, queries in lanes, so the queries' segment ids are a row
# ([B, 1, L]: no lane padding) and the per-query softmax reduces over sublanes.

def _exponentials(q, k, q_seg, kv_seg, scale):
  """exp(scores - their max) [L, bq] (0 where masked: a query always sees its own segment, so the max is a
  real score and exp(finfo.min - max) is 0) and their sums [1, bq]."""
  s = lax.dot_general(k, q, NT, preferred_element_type=jnp.float32) * scale        # [L, bq]
  s = jnp.where(kv_seg == q_seg, s, jnp.finfo(jnp.float32).min)                    # [L, 1] == [1, bq]
  e = jnp.exp(s - jnp.max(s, axis=0, keepdims=True))
  return e, jnp.sum(e, axis=0, keepdims=True)


def _kept(seeds_ref, rate, shape, length, bits):
  """[L, bq]: whether each score of this block is kept, keys in rows: `keep_mask`'s bits ("hash"), or the
  TPU's hardware generator's ("hardware") seeded by the example's and head's seeds and the block."""
  b, n, i = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  base = 2 * (b * pl.num_programs(1) + n)
  if bits == "hardware":
    pltpu.prng_seed(seeds_ref[base], seeds_ref[base + 1] ^ i)
    return _shift(pltpu.prng_random_bits(shape), 16) >= _threshold(rate)
  half = length // 2   # even: `block_q(length, rate)` checked it
  key = lax.broadcasted_iota(jnp.int32, (half, shape[1]), 0)
  query = (lax.broadcasted_iota(jnp.int32, (1, shape[1]), 1) + i * shape[1]) * half    # multiplied once a row
  low, high = _bits(query + key, seeds_ref[base], seeds_ref[base + 1])
  return jnp.concatenate([low, high], axis=0) >= _threshold(rate)


def _weighted_sum(w, x):
  """w.T @ x [bq, K] for transposed weights w [L, bq] and rows x [L, K]. Where [L, bq] is more than twice
  [L, K] and [K, bq] together, as (x.T @ w).T, which transposes those two instead of w: fewer bundles
  (`bert-jax bench kernel`: at 512 tokens, 512 queries a block, 1% to 10% fewer an example on v3, v5e and
  v6e; at 128 tokens, where the rule keeps w.T @ x, that form took up to 5% more)."""
  (length, bq), width = w.shape, x.shape[1]
  if length * bq > 2 * width * (length + bq):
    return lax.dot_general(x.T, w, NN, preferred_element_type=jnp.float32).T
  return lax.dot_general(w.T, x, NN, preferred_element_type=jnp.float32)


def _forward_kernel(seeds_ref, q_ref, k_ref, v_ref, qseg_ref, kvseg_ref, o_ref, *, rate, scale, mm, bits):
  dtype = v_ref.dtype
  q, k, v = (r[...].astype(mm) for r in (q_ref, k_ref, v_ref))
  e, total = _exponentials(q, k, qseg_ref[...], kvseg_ref[...], scale)
  if rate > 0:
    p = jnp.where(_kept(seeds_ref, rate, e.shape, k.shape[0], bits), e * (1.0 / ((1.0 - rate) * total)), 0.0)
  else:
    p = e * (1.0 / total)
  o_ref[...] = _weighted_sum(p.astype(mm), v).astype(dtype)


def _backward_kernel(seeds_ref, q_ref, k_ref, v_ref, qseg_ref, kvseg_ref, do_ref, dq_ref, dk_ref, dv_ref,
                     dk_acc, dv_acc, *, rate, scale, mm, bits):
  i = pl.program_id(2)
  q, k, v, do = (r[...].astype(mm) for r in (q_ref, k_ref, v_ref, do_ref))
  e, total = _exponentials(q, k, qseg_ref[...], kvseg_ref[...], scale)
  p = e * (1.0 / total)                                                            # [L, bq]
  d_dropped = lax.dot_general(v, do, NT, preferred_element_type=jnp.float32)       # [L, bq]
  if rate > 0:
    keep = _kept(seeds_ref, rate, p.shape, k.shape[0], bits)
    dropped = jnp.where(keep, p * (1.0 / (1.0 - rate)), 0.0)
    d_probs = jnp.where(keep, d_dropped * (1.0 / (1.0 - rate)), 0.0)
  else:
    dropped, d_probs = p, d_dropped
  dv = lax.dot_general(dropped.astype(mm), do, NN, preferred_element_type=jnp.float32)
  d_scores = (p * (d_probs - jnp.sum(d_probs * p, axis=0, keepdims=True)) * scale).astype(mm)
  dk = lax.dot_general(d_scores, q, NN, preferred_element_type=jnp.float32)
  dq_ref[...] = _weighted_sum(d_scores, k).astype(dq_ref.dtype)

  @pl.when(i == 0)
  def _():
    dk_acc[...] = jnp.zeros_like(dk_acc)
    dv_acc[...] = jnp.zeros_like(dv_acc)

  dk_acc[...] += dk
  dv_acc[...] += dv

  @pl.when(i == pl.num_programs(2) - 1)
  def _():
    dk_ref[...] = dk_acc[...].astype(dk_ref.dtype)
    dv_ref[...] = dv_acc[...].astype(dv_ref.dtype)


def _specs(length, width, bq):
  """Block specs on grid (b, n, i) of [B, N, L, K] arrays and the segment ids."""
  sq = pl.Squeezed()
  q = pl.BlockSpec((sq, sq, bq, width), lambda b, n, i, s: (b, n, i, 0))
  kv = pl.BlockSpec((sq, sq, length, width), lambda b, n, i, s: (b, n, 0, 0))
  q_seg = pl.BlockSpec((sq, 1, bq), lambda b, n, i, s: (b, 0, i))
  kv_seg = pl.BlockSpec((sq, length, 1), lambda b, n, i, s: (b, 0, 0))
  return q, kv, q_seg, kv_seg


def _call(kernel, grid_spec, out_shape, interpret, semantics):
  return pl.pallas_call(kernel, grid_spec=grid_spec, out_shape=out_shape,
                        compiler_params=pltpu.CompilerParams(dimension_semantics=semantics),
                        interpret=pltpu.InterpretParams() if interpret else False)


def _segments(segment_ids):
  s = segment_ids.astype(jnp.int32)
  return s[:, None, :], s[:, :, None]    # queries' [B, 1, L], keys' [B, L, 1]


def forward(q, k, v, segment_ids, seeds_BN2, rate, interpret, bits="hash"):
  """The forward kernel on [B, N, L, K] queries, keys, values (unscaled) -> context [B, N, L, K]."""
  b, n, length, width = q.shape
  bq = block_q(length, rate)
  q_spec, kv_spec, qseg_spec, kvseg_spec = _specs(length, width, bq)
  grid = pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=(b, n, length // bq),
                                      in_specs=[q_spec, kv_spec, kv_spec, qseg_spec, kvseg_spec],
                                      out_specs=q_spec)
  kernel = functools.partial(_forward_kernel, rate=rate, scale=1.0 / np.sqrt(width), mm=matmul_dtype(q.dtype),
                             bits=bits)
  return _call(kernel, grid, jax.ShapeDtypeStruct(q.shape, q.dtype), interpret,
               ("parallel", "parallel", "parallel"))(seeds_BN2.reshape(-1), q, k, v, *_segments(segment_ids))


def backward(q, k, v, segment_ids, seeds_BN2, do, rate, interpret, bits="hash"):
  """The backward kernel: the context's gradient `do` -> the gradients of q, k and v."""
  b, n, length, width = q.shape
  bq = block_q(length, rate)
  q_spec, kv_spec, qseg_spec, kvseg_spec = _specs(length, width, bq)
  grid = pltpu.PrefetchScalarGridSpec(
      num_scalar_prefetch=1, grid=(b, n, length // bq),
      in_specs=[q_spec, kv_spec, kv_spec, qseg_spec, kvseg_spec, q_spec], out_specs=[q_spec, kv_spec, kv_spec],
      scratch_shapes=[pltpu.VMEM((length, width), jnp.float32)] * 2)
  kernel = functools.partial(_backward_kernel, rate=rate, scale=1.0 / np.sqrt(width), mm=matmul_dtype(q.dtype),
                             bits=bits)
  out = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v)]
  return _call(kernel, grid, out, interpret, ("parallel", "parallel", "arbitrary"))(
      seeds_BN2.reshape(-1), q, k, v, *_segments(segment_ids), do)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _flash(q, k, v, segment_ids, seeds_BN2, rate, interpret, bits):
  return forward(q, k, v, segment_ids, seeds_BN2, rate, interpret, bits)


def _flash_fwd(q, k, v, segment_ids, seeds_BN2, rate, interpret, bits):
  return (forward(q, k, v, segment_ids, seeds_BN2, rate, interpret, bits),
          (q, k, v, segment_ids, seeds_BN2))


def _flash_bwd(rate, interpret, bits, residuals, do):
  q, k, v, segment_ids, seeds_BN2 = residuals
  dq, dk, dv = backward(q, k, v, segment_ids, seeds_BN2, do, rate, interpret, bits)
  return dq, dk, dv, None, None


_flash.defvjp(_flash_fwd, _flash_bwd)


def _kernel_BLNK(q, k, v, segment_ids, seeds_BN2, rate, interpret, bits):
  """The kernel on [B, L, N, K] arrays (one shard's under a mesh)."""
  bnlk = lambda x: x.transpose(0, 2, 1, 3)
  return bnlk(_flash(bnlk(q), bnlk(k), bnlk(v), segment_ids, seeds_BN2, rate, interpret, bits))


def attention(q_BLNK, k_BLNK, v_BLNK, mask, key=None, rate: float = 0.0, bits: str = "hash"):
  """softmax(q k / sqrt(head_dim)) within segments, dropout at `rate` with `key` (None: no dropout),
  weighted sum of v; [B, L, N, K] in and out. `mask`: the encoder's `splash.SegmentMask`. `bits`: the TPU
  kernel's dropout bits, "hash" or "hardware" (module docstring)."""
  if mask.window is not None or mask.causal:
    raise ValueError("attention_kernel 'flash' takes segment ids only; windows and causal masks are splash's")
  batch, length, heads, _ = q_BLNK.shape
  rate = float(rate) if key is not None else 0.0
  block_q(length, rate)
  seeds_BN2 = seeds(key, batch, heads) if rate > 0 else jnp.zeros((batch, heads, 2), jnp.int32)
  segment_ids = mask.segment_ids
  if mask.interpret:   # the interpreter's hardware generator gives zeros: the hash always
    return _sharded(q_BLNK, k_BLNK, v_BLNK, segment_ids, seeds_BN2, rate, True, "hash")
  return lax.platform_dependent(
      q_BLNK, k_BLNK, v_BLNK, segment_ids, seeds_BN2,
      tpu=lambda *a: _sharded(*a, rate, False, bits),
      default=lambda *a: reference(*a, rate))


def _sharded(q, k, v, segment_ids, seeds_BN2, rate, interpret, bits):
  """`_kernel_BLNK` per shard under the abstract mesh (batch and heads sharded as the logical rules say)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return _kernel_BLNK(q, k, v, segment_ids, seeds_BN2, rate, interpret, bits)
  spec = splash.fitting(mesh, q.shape, nn.logical_to_mesh_axes(
      ("activation_batch", "activation_length", "activation_heads", "activation_kv")))
  if spec[1] is not None or spec[3] is not None:
    raise ValueError(f"attention_kernel 'flash' shards batch and heads only; the logical axis rules shard "
                     f"the sequence or the head dimension ({spec})")
  P = jax.sharding.PartitionSpec
  return jax.shard_map(lambda q, k, v, s, seeds: _kernel_BLNK(q, k, v, s, seeds, rate, interpret, bits), mesh=mesh,
                       in_specs=(spec, spec, spec, P(spec[0], None), P(spec[0], spec[2], None)), out_specs=spec,
                       check_vma=False)(q, k, v, segment_ids, seeds_BN2)

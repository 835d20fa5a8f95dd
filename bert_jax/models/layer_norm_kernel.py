"""LayerNorm's backward pass in one Pallas TPU kernel: one read of x and of the gradient, one write of dx.

`models/layer_norm.py`'s backward pass is two XLA fusions: the first reads x and the incoming gradient and
takes each row's two means (and the parameters' column sums), the second reads both again and writes dx;
where the gradient arrives as a sum of two (a post-LN layer's output feeds both the next sublayer and its
residual), the first also writes that sum for the second to read. Here a block of rows sits in VMEM while
its row statistics (recomputed from x, as the forward pass took them), the row means and dx are computed
from it: HBM sees x, the gradients and dx once.

`gradient` takes one gradient or two, [rows, features] in the compute dtype; it returns dx and the scale's
and bias's gradients (float32, summed over the rows: the kernel writes each block's column sums, XLA adds
the blocks). Under a mesh it runs per shard over the rows
(the batch axes of the logical rules), and on backends other than TPU `reference` (XLA ops, the formula of
`layer_norm._normalize_bwd`). "interpret" runs the kernel in Pallas' TPU interpreter on any backend (tests).
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from bert_jax.models import splash

SUBLANES = 8   # rows a trip of the kernel's loop; the column sums' block: [8, features], the first row read back


BLOCK_ELEMENTS = 256 * 1024   # a block's elements: x, the gradients and dx double-buffered in VMEM


def block_rows(rows: int, features: int) -> int | None:
  """Rows a grid step takes: the largest of 256, 128, ..., 8 that divides `rows` and keeps a block within
  BLOCK_ELEMENTS (8 at least); None where none divides (`grid` pads the rows to a multiple of 8)."""
  for block in (256, 128, 64, 32, 16, 8):
    if rows % block == 0 and (block * features <= BLOCK_ELEMENTS or block == 8):
      return block
  return None


def grid(rows: int, features: int) -> tuple[int, int]:
  """(rows the kernel runs on, rows a grid step): `rows` padded to a multiple of 8 where no block divides
  them (rows of zeros add nothing to the column sums and get dx 0)."""
  padded = rows if block_rows(rows, features) else rows + -rows % SUBLANES
  return padded, block_rows(padded, features)


def reference(x, dys, scale, eps, statistics=None):
  """(dx in x's dtype, d_scale, d_bias float32) with XLA ops: `layer_norm`'s backward pass. `dys` a tuple of
  one or two gradients; `scale` None for ones; `statistics` the forward pass's (mean, rstd), else recomputed."""
  mean, rstd = statistics if statistics is not None else _statistics(x.astype(jnp.float32), eps)
  x_hat = (x.astype(jnp.float32) - mean) * rstd
  dy = dys[0].astype(jnp.float32)
  for d in dys[1:]:
    dy = dy + d.astype(jnp.float32)
  g = dy if scale is None else dy * scale.astype(jnp.float32)
  dx = rstd * (g - jnp.mean(g, axis=-1, keepdims=True) - x_hat * jnp.mean(g * x_hat, axis=-1, keepdims=True))
  rows = tuple(range(x.ndim - 1))
  return dx.astype(x.dtype), jnp.sum(dy * x_hat, axis=rows), jnp.sum(dy, axis=rows)


def _statistics(x32, eps):
  """`layer_norm._statistics` of float32 rows: mean and 1 / sqrt(var + eps), [rows, 1]."""
  inv = 1.0 / x32.shape[-1]
  mean = jnp.sum(x32, axis=-1, keepdims=True) * inv
  var = jnp.maximum(jnp.sum(x32 * x32, axis=-1, keepdims=True) * inv - mean * mean, 0.)
  return mean, jax.lax.rsqrt(var + eps)


def _kernel(*refs, n_dy, eps):
  """One block of rows, 8 at a time (one vreg's sublanes; the loop unrolled): row statistics, both row
  means and dx of 8 rows, their dy * x_hat and dy added into the block's [8, features] column sums, which
  are summed over their 8 rows at the end."""
  x_ref, dy_refs, scale_ref, (dx_ref, dscale_ref, dbias_ref) = (
      refs[0], refs[1:1 + n_dy], refs[1 + n_dy], refs[2 + n_dy:])
  rows, features = x_ref.shape
  inv = 1.0 / features
  dscale_ref[...] = jnp.zeros_like(dscale_ref)
  dbias_ref[...] = jnp.zeros_like(dbias_ref)

  def rows_of(i, carry):
    sl = pl.ds(pl.multiple_of(i * SUBLANES, SUBLANES), SUBLANES)
    x = x_ref[sl, :].astype(jnp.float32)
    dy = dy_refs[0][sl, :].astype(jnp.float32)
    for ref in dy_refs[1:]:
      dy = dy + ref[sl, :].astype(jnp.float32)
    mean, rstd = _statistics(x, eps)
    x_hat = (x - mean) * rstd
    g = dy * scale_ref[...]
    a = jnp.sum(g, axis=-1, keepdims=True) * inv
    b = jnp.sum(g * x_hat, axis=-1, keepdims=True) * inv
    dx_ref[sl, :] = (rstd * (g - a - x_hat * b)).astype(dx_ref.dtype)
    dscale_ref[...] += dy * x_hat
    dbias_ref[...] += dy
    return carry

  jax.lax.fori_loop(0, rows // SUBLANES, rows_of, 0, unroll=True)
  for ref in (dscale_ref, dbias_ref):   # the block's sums on every sublane; XLA reads the first
    ref[...] = jnp.broadcast_to(jnp.sum(ref[...], axis=0, keepdims=True), ref.shape)


def _call(x_RH, dys_RH, scale_1H, eps, interpret):
  rows, features = x_RH.shape
  padded, block = grid(rows, features)
  if padded != rows:
    pad = lambda a: jnp.pad(a, ((0, padded - rows), (0, 0)))   # noqa: E731
    dx, d_scale, d_bias = _call(pad(x_RH), tuple(pad(d) for d in dys_RH), scale_1H, eps, interpret)
    return dx[:rows], d_scale, d_bias
  blocks = rows // block
  row = pl.BlockSpec((block, features), lambda i: (i, 0))
  col = pl.BlockSpec((SUBLANES, features), lambda i: (0, 0))   # the scale on every sublane
  part = pl.BlockSpec((None, SUBLANES, features), lambda i: (i, 0, 0))
  out = (jax.ShapeDtypeStruct(x_RH.shape, x_RH.dtype),
         *[jax.ShapeDtypeStruct((blocks, SUBLANES, features), jnp.float32)] * 2)
  # What it moves, for XLA's cost analysis (which counts a custom call without one as moving nothing):
  # each operand read once, each result written once.
  scale_8H = jnp.broadcast_to(scale_1H, (SUBLANES, features))
  moved = sum(a.size * a.dtype.itemsize for a in (x_RH, *dys_RH, scale_8H, *out))
  dx, d_scale, d_bias = pl.pallas_call(
      functools.partial(_kernel, n_dy=len(dys_RH), eps=eps), grid=(blocks,), name="layer_norm_backward",
      in_specs=[row] + [row] * len(dys_RH) + [col], out_specs=[row, part, part], out_shape=out,
      compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
      cost_estimate=pl.CostEstimate(flops=rows * features * (12 + len(dys_RH)), transcendentals=rows,
                                    bytes_accessed=moved),
      interpret=pltpu.InterpretParams() if interpret else False)(x_RH, *dys_RH, scale_8H)
  return dx, jnp.sum(d_scale[:, 0], axis=0), jnp.sum(d_bias[:, 0], axis=0)


def _on_rows(x, dys, scale, eps, interpret):
  """The kernel on one shard's [..., features] arrays."""
  shape = x.shape
  flat = lambda a: a.reshape(-1, a.shape[-1])   # noqa: E731
  dx, d_scale, d_bias = _call(flat(x), tuple(flat(d) for d in dys), scale.astype(jnp.float32).reshape(1, -1),
                              eps, interpret)
  return dx.reshape(shape), d_scale, d_bias


ROWS_AXES = ("activation_batch", "activation_length", "activation_embed")


def _sharded(x, dys, scale, eps, interpret):
  """`_on_rows` per shard: rows split as the logical rules split the activations' batch, features whole."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or x.ndim != 3:
    return _on_rows(x, dys, scale, eps, interpret)
  spec = splash.fitting(mesh, x.shape, nn.logical_to_mesh_axes(ROWS_AXES))
  if spec[2] is not None:
    return reference(x, dys, scale, eps)
  P = jax.sharding.PartitionSpec
  # Every mesh axis the rows are split over (batch and length): the column sums add over all of them.
  split = tuple(a for axes in spec[:2] for a in (axes if isinstance(axes, tuple) else (axes,)) if a is not None)

  def local(x, dys, scale):
    dx, d_scale, d_bias = _on_rows(x, dys, scale, eps, interpret)
    if split:
      d_scale, d_bias = jax.lax.psum((d_scale, d_bias), split)
    return dx, d_scale, d_bias

  return jax.shard_map(local, mesh=mesh, in_specs=(spec, (spec,) * len(dys), P(None)),
                       out_specs=(spec, P(None), P(None)), check_vma=False)(x, dys, scale)


def gradient(x, dys, scale, eps: float, kernel: str = "pallas"):
  """LayerNorm's (dx, d_scale, d_bias) for x [..., features], `dys` one or two gradients of its output and
  `scale` [features]: the kernel on TPU ("pallas"), or in the interpreter everywhere ("interpret");
  elsewhere `reference`. The row statistics are recomputed from x, as the forward pass took them."""
  dys = tuple(dys)
  if kernel == "interpret":
    return _sharded(x, dys, scale, eps, True)
  return jax.lax.platform_dependent(x, dys, scale, tpu=lambda *a: _sharded(*a, eps, False),
                                    default=lambda *a: reference(*a, eps))

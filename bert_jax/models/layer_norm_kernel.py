"""LayerNorm's backward pass in one Pallas TPU kernel: one read of x and of the gradient, one write of dx.

`models/layer_norm.py`'s backward pass is two XLA fusions: the first reads x and the incoming gradient and
takes each row's two means (and the parameters' column sums), the second reads both again and writes dx;
where the gradient arrives as a sum of two (a post-LN layer's output feeds both the next sublayer and its
residual), the first also writes that sum for the second to read. Here a block of rows sits in VMEM while
the row means and dx are computed from it: HBM sees x, the gradients, the saved statistics and dx once.

`gradient` takes one gradient or two, [rows, features] in the compute dtype, with the forward pass's saved
row statistics; it returns dx and the scale's and bias's gradients (float32, summed over the rows: the
kernel writes each block's column sums, XLA adds the blocks). Under a mesh it runs per shard over the rows
(the batch axes of the logical rules), and on backends other than TPU `reference` (XLA ops, the formula of
`layer_norm._normalize_bwd`). "interpret" runs the kernel in Pallas' TPU interpreter on any backend (tests).
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

SUBLANES = 8   # the column sums' block: [8, features], the first row read back


def block_rows(rows: int) -> int:
  """Rows a grid step takes: the largest of 256, 128, ..., 8 that divides `rows` (else all of them)."""
  for block in (256, 128, 64, 32, 16, 8):
    if rows % block == 0:
      return block
  return rows


def reference(x, dys, scale, eps):
  """(dx in x's dtype, d_scale, d_bias float32) with XLA ops; `dys` a tuple of one or two gradients."""
  mean, rstd = _statistics(x.astype(jnp.float32), eps)
  x_hat = (x.astype(jnp.float32) - mean) * rstd
  dy = sum(d.astype(jnp.float32) for d in dys)
  g = dy * scale.astype(jnp.float32)
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
  x_ref, dy_refs, scale_ref, (dx_ref, dscale_ref, dbias_ref) = (
      refs[0], refs[1:1 + n_dy], refs[1 + n_dy], refs[2 + n_dy:])
  x = x_ref[...].astype(jnp.float32)
  dy = dy_refs[0][...].astype(jnp.float32)
  for ref in dy_refs[1:]:
    dy = dy + ref[...].astype(jnp.float32)
  mean, rstd = _statistics(x, eps)
  x_hat = (x - mean) * rstd
  g = dy * scale_ref[...]
  inv = 1.0 / x.shape[-1]
  a = jnp.sum(g, axis=-1, keepdims=True) * inv
  b = jnp.sum(g * x_hat, axis=-1, keepdims=True) * inv
  dx_ref[...] = (rstd * (g - a - x_hat * b)).astype(dx_ref.dtype)
  dscale_ref[...] = jnp.broadcast_to(jnp.sum(dy * x_hat, axis=0, keepdims=True), dscale_ref.shape)
  dbias_ref[...] = jnp.broadcast_to(jnp.sum(dy, axis=0, keepdims=True), dbias_ref.shape)


def _call(x_RH, dys_RH, scale_1H, eps, interpret):
  rows, features = x_RH.shape
  block = block_rows(rows)
  blocks = rows // block
  row = pl.BlockSpec((block, features), lambda i: (i, 0))
  col = pl.BlockSpec((1, features), lambda i: (0, 0))
  part = pl.BlockSpec((None, SUBLANES, features), lambda i: (i, 0, 0))
  out = (jax.ShapeDtypeStruct(x_RH.shape, x_RH.dtype),
         *[jax.ShapeDtypeStruct((blocks, SUBLANES, features), jnp.float32)] * 2)
  # What it moves, for XLA's cost analysis (which counts a custom call without one as moving nothing):
  # each operand read once, each result written once.
  moved = sum(a.size * a.dtype.itemsize for a in (x_RH, *dys_RH, scale_1H, *out))
  dx, d_scale, d_bias = pl.pallas_call(
      functools.partial(_kernel, n_dy=len(dys_RH), eps=eps), grid=(blocks,),
      in_specs=[row] + [row] * len(dys_RH) + [col], out_specs=[row, part, part], out_shape=out,
      compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
      cost_estimate=pl.CostEstimate(flops=rows * features * (12 + len(dys_RH)), transcendentals=rows,
                                    bytes_accessed=moved),
      interpret=pltpu.InterpretParams() if interpret else False)(x_RH, *dys_RH, scale_1H)
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
  from bert_jax.models import splash   # pylint: disable=g-import-not-at-top
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or x.ndim != 3:
    return _on_rows(x, dys, scale, eps, interpret)
  spec = splash.fitting(mesh, x.shape, nn.logical_to_mesh_axes(ROWS_AXES))
  if spec[2] is not None:
    return reference(x, dys, scale, eps)
  P = jax.sharding.PartitionSpec
  batch = tuple(a for a in (spec[0] if isinstance(spec[0], tuple) else (spec[0],)) if a is not None)

  def local(x, dys, scale):
    dx, d_scale, d_bias = _on_rows(x, dys, scale, eps, interpret)
    if batch:
      d_scale, d_bias = jax.lax.psum((d_scale, d_bias), batch)
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
  return lax.platform_dependent(x, dys, scale, tpu=lambda *a: _sharded(*a, eps, False),
                                default=lambda *a: reference(*a, eps))

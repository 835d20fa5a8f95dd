"""Matmuls in the form XLA:CPU hands to its matrix library (`model.matmuls = "library"`).

XLA:CPU runs a dot in YNNPACK when both operands are row-major with the contraction on the left operand's
last axis, and the result is float32 for bfloat16 operands (`xla/backends/cpu/ynn_support.cc`,
`IsDotSupportedByYnn`); on a CPU with AMX that bfloat16 product runs at about five times the float32 one.
Any other dot is first converted to float32 operands and runs on XLA's own kernels: a bfloat16 x
bfloat16 -> bfloat16 product (what `jnp.einsum` writes in bfloat16 compute), and a weight gradient x^T g,
which contracts the rows, the leading axis of both operands. Autodiff writes both.

`affine(x, w, b)` is x @ w + b with its own backward pass, each of its three products in that form: results
in float32, cast to the operands' dtype after; x's gradient g @ w^T (the right operand's contraction on its
last axis is in the form too); w's gradient from the smaller of x and g transposed in memory through a 3-D
transpose, which XLA makes a copy (a 2-D one it folds into the dot as a column-major operand, out of the
form; `rows_transposed_product`). `matmul` is it without a bias, `Dense` the layer, `einsum` the batched
products' form. The products are autodiff's; in float32 the sums are float32's either way.
"""

import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

_F32 = jnp.float32


def _rows(a):
  """[..., D] -> [N, D]; also for D = 0 (a layer with every head pruned), where -1 would not resolve."""
  return a.reshape(math.prod(a.shape[:-1]), a.shape[-1])


def _product(lhs, rhs, contract_rhs: int):
  """lhs [M, K] @ rhs ([K, N] with contract_rhs 0, [N, K] with 1), float32."""
  return jax.lax.dot_general(lhs, rhs, (((1,), (contract_rhs,)), ((), ())), preferred_element_type=_F32)


def einsum(equation: str, a, b, dtype):
  """`jnp.einsum(equation, a, b)` written in float32 and rounded to `dtype`: for bfloat16 operands the library's
  form, where a bfloat16 result is not (the same values: XLA:CPU computes a bfloat16 product in float32 either
  way). The attention's batched products take it (`softmax_dropout`)."""
  return jnp.einsum(equation, a, b, preferred_element_type=_F32).astype(dtype)


def _split(n: int) -> tuple[int, int] | None:
  """n = a * b with a the smallest factor above 1 (None for n < 4 or prime): the 3-D shape whose transpose
  XLA writes as a copy."""
  for a in range(2, math.isqrt(n) + 1):
    if n % a == 0:
      return a, n // a
  return None


def transposed(a_MK):
  """a [M, K] -> [K, M], written out row-major through a 3-D transpose where M factors (a 2-D transpose XLA
  folds into its consumer's layout, column-major); else the 2-D transpose."""
  split = _split(a_MK.shape[0])
  if split is None:
    return a_MK.T
  return jnp.transpose(a_MK.reshape(*split, a_MK.shape[1]), (2, 0, 1)).reshape(a_MK.shape[1], a_MK.shape[0])


def rows_transposed_product(x_MK, g_MN, dtype):
  """x^T g [K, N] for x [M, K] and g [M, N], the sum over the rows M, in `dtype`. Where M factors, the smaller
  of the two is written out transposed and multiplies the other (g^T x, then its [N, K] result transposed,
  where g is the smaller: the feed-forward output's weight gradient, whose x is four times g); else autodiff's
  product, which XLA:CPU runs on its own kernels."""
  if _split(x_MK.shape[0]) is None:
    return jax.lax.dot_general(x_MK, g_MN, (((0,), (0,)), ((), ())), preferred_element_type=_F32).astype(dtype)
  if x_MK.size <= g_MN.size:
    return _product(transposed(x_MK), g_MN, 0).astype(dtype)
  return transposed(_product(transposed(g_MN), x_MK, 0).astype(dtype))


@jax.custom_vjp
def affine(x, w, b):
  """x [..., K] @ w [K, N] + b [N] -> [..., N] in x's dtype (x and w in one dtype; the bias added to the
  float32 product)."""
  y = _product(_rows(x), w, 0) + b.astype(_F32)
  return y.astype(x.dtype).reshape(*x.shape[:-1], w.shape[1])


def _affine_forward(x, w, b):
  return affine(x, w, b), (x, w, b)


def _affine_backward(residuals, g):
  x, w, b = residuals
  g_MN = _rows(g).astype(x.dtype)
  d_x = _product(g_MN, w, 1).astype(x.dtype).reshape(x.shape)
  d_w = rows_transposed_product(_rows(x), g_MN, w.dtype)
  # A float32 sum: XLA:CPU rewrites a long bfloat16 reduction into a slow tree of windows.
  d_b = jnp.sum(g_MN.astype(_F32), axis=0).astype(b.dtype)
  return d_x, d_w, d_b


affine.defvjp(_affine_forward, _affine_backward)


def matmul(x, w, b=None):
  """x [..., K] @ w [K, N] (+ b [N]) through `affine` (a zero bias where there is none: its gradient is
  dropped)."""
  return affine(x, w, jnp.zeros(w.shape[1:], x.dtype) if b is None else b)


class Dense(nn.Module):
  """`nn.Dense` with its product through `affine`: the same parameters ("kernel" [K, N], "bias" [N]), kernel
  and input in `dtype`; the kernel first through `prepare_kernel` where given (`fsdp_gather.gathered`)."""
  features: int
  use_bias: bool
  kernel_init: Callable
  bias_init: Callable
  dtype: Any
  param_dtype: Any
  prepare_kernel: Callable | None = None

  @nn.compact
  def __call__(self, x):
    kernel = self.param("kernel", self.kernel_init, (x.shape[-1], self.features), self.param_dtype)
    bias = self.param("bias", self.bias_init, (self.features,), self.param_dtype) if self.use_bias else None
    x, kernel, bias = nn.dtypes.promote_dtype(x, kernel, bias, dtype=self.dtype)
    return matmul(x, self.prepare_kernel(kernel) if self.prepare_kernel else kernel, bias)


def matmuls_hint(cfg, mesh) -> str | None:
  """A line for a bfloat16 run on CPUs whose matmuls keep XLA's layout, which XLA:CPU computes in float32
  (`model.matmuls`: this module's form); None otherwise."""
  if cfg.dtype != jnp.bfloat16 or cfg.library_matmuls or mesh.devices.flat[0].platform != "cpu":
    return None
  return ("bfloat16 on CPUs: XLA:CPU computes these matmuls in float32; --config.model.matmuls=library writes "
          "them in the form its matrix library runs in bfloat16 (AMX; README, 'Training in bfloat16 on a CPU')")

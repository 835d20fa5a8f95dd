"""LayerNorm whose forward pass reads its input once and whose backward pass reads it twice.

The same function as `flax.linen.LayerNorm` (statistics in float32 whatever the compute dtype, output
in `dtype`, parameters `scale` and `bias`), written with its own gradient:

- Forward: the mean and the mean of squares are sums over the same row, so one pass over x gives
  both (var = E[x^2] - E[x]^2 in float32). The exact two-pass variance reads x a second time, after
  the mean, and autodiff's gradient of it needs a reduction that waits on another: three passes over
  each [rows, embed] array where two suffice.
- Backward: with x_hat = (x - mean) * rstd and g = dy * scale, dx = rstd * (g - mean(g) - x_hat *
  mean(g * x_hat)); the two row means and the parameters' column sums come from one pass over dy and
  x, dx from a second. The pass saves only x and the two [rows] statistics, so a scanned stack needs
  no recomputation to keep its saved arrays small.

On BERT-large phase 1 (v3:8x8, 4 layers) XLA's count falls from 1.1085 to 1.0893 GB a core
(docs/performance.md). The one-pass variance loses float32 digits when a row's mean is large
against its spread (about 1e-7 * (1 + mean^2 / var) relative); a post-LN BERT's rows are near zero
mean, and the outputs match Hugging Face's to the tolerances of tests/test_checkpoints.py.

`layer_norm(cfg, name)` is the one the encoder and its heads build: over `embed`, with BERT's epsilon.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.models import layer_norm_kernel
from bert_jax.models.config import BertConfig
from bert_jax.models.projections import zeros


def _statistics(x, eps):
  """Row mean and 1 / sqrt(var + eps), float32, [..., 1], from one pass over x."""
  x32 = x.astype(jnp.float32)
  mean = jnp.mean(x32, axis=-1, keepdims=True)
  var = jnp.maximum(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) - jnp.square(mean), 0.)
  return mean, jax.lax.rsqrt(var + eps)


def _apply(x, mean, rstd, scale, bias, dtype):
  y = (x.astype(jnp.float32) - mean) * rstd
  if scale is not None:
    y = y * scale.astype(jnp.float32)
  if bias is not None:
    y = y + bias.astype(jnp.float32)
  return y.astype(dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def normalize(x, scale, bias, eps: float, dtype, kernel: str = "xla"):
  """LayerNorm of x over its last axis; `scale` and `bias` [embed] or None; `kernel` the backward pass's
  (`BertConfig.layer_norm_kernel`)."""
  return _apply(x, *_statistics(x, eps), scale, bias, dtype)


def _normalize_fwd(x, scale, bias, eps, dtype, kernel):
  mean, rstd = _statistics(x, eps)
  return _apply(x, mean, rstd, scale, bias, dtype), (x, mean, rstd, scale, bias)


def _backward(eps, kernel, saved, dys):
  """(dx, d_scale, d_bias) from the gradients `dys` (one, or two apart) of the output: XLA's two fusions,
  or `kernel`'s (`layer_norm_kernel.gradient`; a missing scale is ones there)."""
  x, mean, rstd, scale, bias = saved
  if kernel == "xla":
    dx, d_scale, d_bias = layer_norm_kernel.reference(x, dys, scale, eps, (mean, rstd))
  else:
    ones = scale if scale is not None else jnp.ones(x.shape[-1:], jnp.float32)
    dx, d_scale, d_bias = layer_norm_kernel.gradient(x, dys, ones, eps, kernel)
  return (dx, None if scale is None else d_scale.astype(scale.dtype),
          None if bias is None else d_bias.astype(bias.dtype))


def _normalize_bwd(eps, dtype, kernel, saved, dy):
  del dtype
  return _backward(eps, kernel, saved, (dy,))


normalize.defvjp(_normalize_fwd, _normalize_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def normalize_pair(x, scale, bias, eps: float, dtype, kernel: str = "xla"):
  """`normalize`'s output twice, for two users: the backward pass takes their gradients apart (the kernel
  reads both, where their sum would be written first for it to read)."""
  y = normalize(x, scale, bias, eps, dtype, kernel)
  return y, y


def _pair_fwd(x, scale, bias, eps, dtype, kernel):
  y, saved = _normalize_fwd(x, scale, bias, eps, dtype, kernel)
  return (y, y), saved


def _pair_bwd(eps, dtype, kernel, saved, dys):
  del dtype
  return _backward(eps, kernel, saved, tuple(dys))


normalize_pair.defvjp(_pair_fwd, _pair_bwd)


class LayerNorm(nn.Module):
  """`normalize` with parameters named as `flax.linen.LayerNorm`'s (`scale`, `bias`)."""
  epsilon: float = 1e-6
  dtype: jnp.dtype | None = None
  param_dtype: jnp.dtype = jnp.float32
  use_bias: bool = True
  scale_init: nn.initializers.Initializer = nn.initializers.ones_init()
  bias_init: nn.initializers.Initializer = nn.initializers.zeros_init()
  kernel: str = "xla"   # the backward pass's: `BertConfig.layer_norm_kernel`

  @nn.compact
  def __call__(self, x, pair: bool = False):
    """y, or (y, y) with `pair` (`normalize_pair`: for an output with two users)."""
    features = (x.shape[-1],)
    scale = self.param("scale", self.scale_init, features, self.param_dtype)
    bias = self.param("bias", self.bias_init, features, self.param_dtype) if self.use_bias else None
    dtype = self.dtype or jnp.result_type(x, scale)
    return (normalize_pair if pair else normalize)(x, scale, bias, self.epsilon, dtype, self.kernel)


def layer_norm(cfg: BertConfig, name: str, in_layer: bool = False) -> nn.Module:
  """LayerNorm over `embed` with BERT's epsilon (`LayerNorm` above: statistics in float32 whatever
  cfg.dtype is, one pass over x forward and two backward).

  It saves only its input and two [rows] statistics for the backward pass, so a scanned stack needs no
  recomputation of it (autodiff's LayerNorm saved its float32 intermediates there, and was rematerialised
  when scanned). The parameters (`scale`, `bias`) and their names are flax's. `in_layer`: a Transformer
  layer's norm, whose backward pass takes `cfg.layer_norm_kernel` (the embeddings' and the heads' keep XLA's).
  """
  return LayerNorm(epsilon=cfg.layer_norm_eps, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                   name=name, use_bias=cfg.norm_bias,
                   kernel=cfg.layer_norm_kernel if in_layer else "xla",
                   scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("embed",)),
                   bias_init=zeros(("embed",)))

"""The encoder's linear layers: their parameters, how their weights are gathered, and their products.

`dense` (the feed-forward, pooler and head projections, `nn.Dense`), `Einsum` (an attention projection,
its kernel [H, N, K] or [N, K, H] multiplied as a matrix) and `fused_qkv` (queries, keys and values from
one product). Without `reshard_after_forward` a weight is gathered once a step (`fsdp_gather`); with it,
where XLA chooses. Parameters carry logical axis names only (`config.logical_axis_rules`).
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.models import fsdp_gather
from bert_jax.models import library_matmul
from bert_jax.models.config import BertConfig


def dense_init(cfg: BertConfig, names: tuple):
  """Truncated normal with stddev initializer_range (google-research/bert), with logical axis names."""
  return nn.with_logical_partitioning(nn.initializers.truncated_normal(cfg.initializer_range), names)


def zeros(names: tuple):
  """Zeros with logical axis names (biases)."""
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), names)


def constrain(x, *names):
  """x constrained to the mesh axes its logical axis `names` map to."""
  return nn.with_logical_constraint(x, names)


class Einsum(nn.Module):
  """An attention projection, `einsum(equation, x, kernel) + bias` (bias over the kernel's trailing axes):
  "blh,hnk->blnk" into the heads or "blnk,nkh->blh" out of them.

  The kernel's heads and head-size axes are multiplied as one: [H, N, K] as the matrix [H, N * K], [N, K, H]
  as [N * K, H] (the parameter keeps its shape; the reshape is of the shard, before its gather). A TPU
  stores a matrix in (8, 128) tiles of its two minor dims: the 3-D kernel's were (H, K), and K = 64 padded
  each gathered copy, the matmuls' reads of it and the weight gradient to twice their bytes (BERT-large
  phase 1 on v3:8x8 with 4 layers: 1.266 -> 1.216 GB a core; docs/performance.md). The products are the
  same. (nn.DenseGeneral initialises a flattened kernel and trips over rank-3 logical constraints.)
  """
  config: BertConfig
  equation: str
  kernel_shape: tuple
  kernel_axes: tuple
  bias_axes: tuple

  @nn.compact
  def __call__(self, x):
    cfg = self.config
    kernel, bias = _kernel_and_bias(self, self.kernel_shape, self.kernel_axes, self.bias_axes)
    x, kernel = nn.dtypes.promote_dtype(x, kernel, dtype=cfg.dtype)
    if self.equation == "blh,hnk->blnk":
      hidden, heads, size = self.kernel_shape
      matrix, names = kernel.reshape(hidden, heads * size), self.kernel_axes[:2]
    elif self.equation == "blnk,nkh->blh":
      heads, size, hidden = self.kernel_shape
      matrix, names = kernel.reshape(heads * size, hidden), self.kernel_axes[:1] + self.kernel_axes[2:]
      x = x.reshape(*x.shape[:-2], heads * size)
    else:
      raise ValueError(f"an attention projection is 'blh,hnk->blnk' or 'blnk,nkh->blh', not {self.equation!r}")
    if cfg.library_matmuls:
      y = _library_product(cfg, x, matrix, bias, names)
      return y.reshape(*y.shape[:-1], heads, size) if self.equation == "blh,hnk->blnk" else y
    y = jnp.einsum("bli,io->blo", x, _gathered_matrix(cfg, matrix, names))
    if self.equation == "blh,hnk->blnk":
      y = y.reshape(*y.shape[:-1], heads, size)
    return y if bias is None else y + bias.astype(cfg.dtype)


def _kernel_and_bias(module: nn.Module, kernel_shape: tuple, kernel_axes: tuple, bias_axes: tuple) -> tuple:
  """An attention projection's parameters in `module`: "kernel" and, with `dense_bias`, "bias" over the
  kernel's trailing axes (else None)."""
  cfg = module.config
  kernel = module.param("kernel", dense_init(cfg, kernel_axes), kernel_shape, cfg.param_dtype)
  if not cfg.dense_bias:
    return kernel, None
  bias_shape = kernel_shape[len(kernel_shape) - len(bias_axes):]
  return kernel, module.param("bias", zeros(bias_axes), bias_shape, cfg.param_dtype)


def _gathered_matrix(cfg: BertConfig, matrix, names: tuple):
  """An attention projection's matrix (logical axes `names`) as its matmul takes it: gathered once a step
  (`fsdp_gather`) without `reshard_after_forward`; else left to XLA, with `constrain_attention_matrices`
  sharded as the kernel, so that XLA gathers the matrix and reduce-scatters its gradient."""
  if not cfg.reshard_after_forward:
    return fsdp_gather.gathered(matrix, names)
  return constrain(matrix, *names) if cfg.constrain_attention_matrices else matrix


def _library_product(cfg: BertConfig, x, matrix, bias, names: tuple):
  """x @ matrix (+ bias, flattened to the matrix's columns) through `library_matmul.matmul`, the matrix
  gathered as `_gathered_matrix` does: an attention projection under `matmuls` "library"."""
  return library_matmul.matmul(x, _gathered_matrix(cfg, matrix, names),
                               None if bias is None else bias.reshape(-1).astype(cfg.dtype))


def mesh_shards(logical_name: str) -> int:
  """How many shards the mesh in context splits the logical axis `logical_name` into (1 without one)."""
  rules, mesh = nn.get_logical_axis_rules(), jax.sharding.get_abstract_mesh()
  if not rules or mesh.empty:
    return 1
  axes = nn.logical_to_mesh_axes((logical_name,), rules)[0]
  axes = () if axes is None else axes if isinstance(axes, tuple) else (axes,)
  return math.prod(mesh.shape[a] for a in axes)


class _Weights(nn.Module):
  """An attention projection's parameters as `Einsum` makes them ("kernel" [H, N, K], "bias" [N, K]),
  returned for a product taken elsewhere (`fused_qkv`)."""
  config: BertConfig
  kernel_shape: tuple

  @nn.compact
  def __call__(self):
    return _kernel_and_bias(self, self.kernel_shape, ("embed", "heads", "kv"), ("heads", "kv"))


def fused_qkv(cfg: BertConfig, x_BLH, shape: tuple) -> list:
  """Queries, keys and values [B, L, N, K] from one product with the three kernels stacked.

  The matrix is [3, H, N * K] (query, key, value; `heads` on its last axis, so each tensor shard holds
  its own heads of all three and nothing moves between tensor shards), the product [3, B, L, N * K]. One
  matmul reads x once, and in the backward pass one matmul gives x's gradient, all-reduced over the tensor
  shards once instead of three times (BERT-large phase 1 on v3:8x8, 4 layers, against the three matmuls:
  XLA's bytes 1.129 -> 1.108 GB a core with the columns side by side; docs/performance.md). With the three
  on the leading axis the backward pass puts the three gradients together end to end, where side by side
  ([H, 3 * N * K]) it needed a relayout copy of them too (24 layers: 4.28 -> 4.19 GB a core). The
  parameters are `Einsum`'s, named "query", "key" and "value"; the products are the same.
  """
  hidden, heads, size = shape
  weights = [_Weights(cfg, shape, name=n)() for n in ("query", "key", "value")]
  if cfg.library_matmuls:   # the library's form has no stacked product: the three apart, the same values
    return [_library_product(cfg, x_BLH.astype(cfg.dtype), kernel.astype(cfg.dtype).reshape(hidden, heads * size),
                             bias, ("embed", "heads")).reshape(*x_BLH.shape[:-1], heads, size)
            for kernel, bias in weights]
  matrix = jnp.stack([k.astype(cfg.dtype).reshape(hidden, heads * size) for k, _ in weights])
  y = jnp.einsum("bli,cio->cblo", x_BLH.astype(cfg.dtype), _gathered_matrix(cfg, matrix, (None, "embed", "heads")))
  out = []
  for y_BLO, (_, bias) in zip(y, weights):
    y_BLNK = y_BLO.reshape(*y_BLO.shape[:-1], heads, size)
    out.append(y_BLNK if bias is None else y_BLNK + bias.astype(cfg.dtype))
  return out


def linear(cfg: BertConfig, features: int, kernel_init, bias_init, use_bias: bool = True, prepare_kernel=None,
           **kwargs) -> nn.Module:
  """`nn.Dense(features)` in the config's dtypes, or under `matmuls` "library" its form through
  `library_matmul.Dense` (the same parameters; `prepare_kernel`, the kernel's gather, its only extra). Every
  projection of the encoder and the heads is made here or in `dense`."""
  if cfg.library_matmuls:
    return library_matmul.Dense(features, use_bias, kernel_init, bias_init, cfg.dtype, cfg.param_dtype,
                                prepare_kernel=prepare_kernel, **kwargs)
  return nn.Dense(features, use_bias=use_bias, dtype=cfg.dtype, param_dtype=cfg.param_dtype, kernel_init=kernel_init,
                  bias_init=bias_init, **kwargs)


def dense(cfg: BertConfig, features: int, names: tuple, name: str, use_bias: bool | None = None,
          in_layer: bool = False) -> nn.Module:
  """A projection to `features` with logical axis names `names`; bias as `use_bias`, by default `dense_bias`.

  Without `reshard_after_forward` its kernel is gathered once a step (`fsdp_gather`), except in a layer
  of a looped stack (`in_layer`, `BertConfig.looped_layers`): there the gathered copy kept for the backward
  pass is written into an array of all layers, a copy that moves more bytes than gathering the kernel again
  (BERT-large phase 1 on v3:8x8, 4 scanned layers: 1.410 -> 1.379 GB a core). The attention projections
  (`Einsum`) keep their single gather scanned too: gathered again, each needs a relayout copy for its matmul.

  Its input's leading dims are taken as one (`rows_dot_general`), except in a layer of a scanned stack,
  looped or not: there the reshape cost the TPU step copies (the same 4 scanned layers: 1.377 -> 1.406 GB a
  core), and unrolled over the stacked params it kept XLA from recomputing the attention norm's and the
  GELU's outputs in their matmuls (24 layers: 3.958 -> 3.832 GB a core, MFU bound 89.0% -> 91.9%).
  """
  looped, stacked = in_layer and cfg.looped_layers, in_layer and cfg.scan_layers
  gather = not cfg.reshard_after_forward and not looped
  if cfg.library_matmuls:
    return linear(cfg, features, dense_init(cfg, names), zeros(names[-1:]),
                  cfg.dense_bias if use_bias is None else use_bias,
                  (lambda w: fsdp_gather.gathered(w, names)) if gather else None, name=name)
  dot_general = fsdp_gather.dot_general(names) if gather else jax.lax.dot_general
  return nn.Dense(features, dtype=cfg.dtype, param_dtype=cfg.param_dtype, name=name,
                  use_bias=cfg.dense_bias if use_bias is None else use_bias,
                  kernel_init=dense_init(cfg, names), bias_init=zeros(names[-1:]),
                  dot_general=dot_general if stacked else rows_dot_general(dot_general))


def rows_dot_general(dot_general):
  """`dot_general` for `nn.Dense`, its input's leading dims taken as one: [B, L, H] @ [H, F] is the matmul
  [B * L, H] @ [H, F], the same products. XLA:CPU ran the train step of `bench train`'s model 7% faster
  so; the unrolled TPU step is the same or a little smaller (docs/performance.md). The leading dims are
  the batch (sharded) and the length (not), so the reshape moves nothing between devices."""
  def dot(lhs, rhs, dimension_numbers, **kwargs):
    (lhs_contract, rhs_contract), batch_dims = dimension_numbers
    if lhs.ndim <= 2 or batch_dims != ((), ()) or (tuple(lhs_contract), tuple(rhs_contract)) != ((lhs.ndim - 1,), (0,)):
      return dot_general(lhs, rhs, dimension_numbers, **kwargs)
    out = dot_general(lhs.reshape(-1, lhs.shape[-1]), rhs, (((1,), (0,)), ((), ())), **kwargs)
    return out.reshape(*lhs.shape[:-1], *out.shape[1:])
  return dot

"""BERT's attention in training, as one differentiable function with a leaner backward pass.

    context = attend(q, k, v, mask, key, rate, residual_dtype)

equals the encoder's explicit path: scores `q k^T / sqrt(head_dim)` in float32, masked (`where(mask,
scores, finfo.min)`), softmax in float32, zeroed where masked, `dropout.Dropout(rate, bits)` with `key` (the
same bits: `dropout.keep_mask`, kept values divided by 1 - rate), cast to the values' dtype,
then the weighted sum of `v`. Autodiff of those ops saves three [batch, heads, length, length] arrays
for the backward pass: the float32 probabilities, the dropout mask and the dropped probabilities (the
matmul's operand; 7 bytes an element with bfloat16), and hands the float32 gradient of the scores to both
of its matmuls. Here the backward pass keeps the probabilities in `residual_dtype` and the mask, and
recomputes the dropped probabilities from them where the values' gradient needs them:

- `residual_dtype=float32`: 5 bytes an element, and the gradients are autodiff's (the dropped
  probabilities are recomputed exactly as the forward pass made them).
- `residual_dtype=bfloat16`: 3 bytes an element, and the scores' gradient goes to the matmuls that make
  the queries' and keys' gradients in bfloat16 (2 bytes instead of 4, read twice): the softmax's backward
  pass uses probabilities rounded to bfloat16 (up to 2^-8 relative), and the values' gradient dropped
  probabilities recomputed from them (one more rounding), as fused half-precision softmax and
  flash-attention kernels do (Megatron-LM's `scaled_masked_softmax` saves its half-precision output).
  For bfloat16 compute; in float32 it costs float32 gradients their precision (0.5% of the largest).

`scores_dtype` is the dtype the scores' matmul writes (`BertConfig.attention_scores`): float32, or
bfloat16 as mixed-precision BERTs elsewhere write them (PyTorch's autocast; Megatron-LM's fused softmax
takes half-precision scores); the softmax is float32 on them either way. On TPU v3, XLA writes the scores
once and reads them for the softmax's sum, for the weighted sum and again in the backward pass (it
recomputes the probabilities from them rather than keep the residual it is given), so their dtype sets
most of the attention's bytes there; on v5e and v6e they stay on chip and it changes little.

At sequence 512 these arrays are most of BERT's attention traffic (docs/performance.md).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.models import dropout
from bert_jax.models import library_matmul


def _dropped(probs, keep, rate: float, dtype):
  return jnp.where(keep, probs / (1.0 - rate), 0.0).astype(dtype)


def _product(equation: str, a, b, dtype, library: bool):
  """einsum(equation, a, b) in `dtype`; with `library` (`model.matmuls` "library") in XLA:CPU's library form
  (`library_matmul.einsum`)."""
  if library:
    return library_matmul.einsum(equation, a, b, dtype)
  return jnp.einsum(equation, a, b, preferred_element_type=dtype)


def probabilities(q, k, mask, scores_dtype=jnp.float32, library: bool = False):
  """The encoder's attention probabilities [B, N, L, L], float32: scores (written in `scores_dtype`),
  scaled, masked softmax in float32, 0 where masked."""
  scores = _product("bqnk,bsnk->bnqs", q, k, scores_dtype, library).astype(jnp.float32)
  scores = jnp.where(mask, scores / np.sqrt(q.shape[-1]), jnp.finfo(jnp.float32).min)
  return jnp.where(mask, jax.nn.softmax(scores, axis=-1), 0.0)   # float32 on purpose


def _forward(q, k, v, mask, key, rate, residual_dtype, scores_dtype, bits, library):
  probs = probabilities(q, k, mask, scores_dtype, library)
  keep = dropout.keep_mask(key, rate, probs.shape, bits)
  context = _product("bnqs,bsnk->bqnk", _dropped(probs, keep, rate, v.dtype), v, v.dtype, library)
  return context, (q, k, v, probs.astype(residual_dtype), keep)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8, 9))
def attend(q, k, v, mask, key, rate: float, residual_dtype=jnp.float32, scores_dtype=jnp.float32,
           bits: str = "threefry", library: bool = False):
  """Queries, keys, values [B, L, N, K] (one dtype), `mask` broadcasting to [B, N, L, L], dropout at
  `rate` with `key` and `bits` (`dropout.keep_mask`) -> context [B, L, N, K] in the values' dtype (module
  docstring). `library`: the products in XLA:CPU's library form (`_product`)."""
  return _forward(q, k, v, mask, key, rate, residual_dtype, scores_dtype, bits, library)[0]


def _backward(rate, residual_dtype, scores_dtype, bits, library, residuals, d_context):
  q, k, v, probs, keep = residuals
  probs = probs.astype(jnp.float32)
  d_v = _product("bnqs,bqnk->bsnk", _dropped(probs, keep, rate, v.dtype), d_context, v.dtype, library)
  # In the values' dtype, as the matmul's transpose hands it to the cast before it.
  d_dropped = _product("bqnk,bsnk->bnqs", d_context, v, v.dtype, library).astype(jnp.float32)
  d_probs = jnp.where(keep, d_dropped / (1.0 - rate), 0.0)
  # softmax's backward pass: probs (d - <d, probs>); masked entries have probability 0 and get none.
  d_scores = probs * (d_probs - jnp.sum(d_probs * probs, axis=-1, keepdims=True)) / np.sqrt(q.shape[-1])
  d_scores = d_scores.astype(residual_dtype)
  d_q = jnp.einsum("bnqs,bsnk->bqnk", d_scores, k, preferred_element_type=jnp.float32).astype(q.dtype)
  d_k = jnp.einsum("bnqs,bqnk->bsnk", d_scores, q, preferred_element_type=jnp.float32).astype(k.dtype)
  return d_q, d_k, d_v.astype(v.dtype), None, None


attend.defvjp(_forward, _backward)

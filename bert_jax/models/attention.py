"""BERT's multi-head self-attention (Devlin et al. 2019; Vaswani et al. 2017, 3.2) with its output projection,
no residual: the fused kernels (`splash`, `flash_dropout`) where they apply, else XLA's
`jax.nn.dot_product_attention`, else the explicit softmax (`softmax_dropout`) that training with attention
dropout and `output_attentions` take. The masks and RoPE tables it reads are the encoder's (`layer_context`).
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.models import dropout
from bert_jax.models import flash_dropout
from bert_jax.models import projections
from bert_jax.models import rotary
from bert_jax.models import softmax_dropout
from bert_jax.models import splash
from bert_jax.models.config import BertConfig
from bert_jax.models.projections import constrain as _constrain


class SelfAttention(nn.Module):
  """Multi-head self-attention with output projection (no residual)."""
  config: BertConfig
  num_heads: int | None = None   # this layer's heads after pruning; None: config.num_heads

  @nn.compact
  def __call__(self, x_BLH, mask, rope, deterministic: bool, head_mask_N=None, output_attentions: bool = False,
               segments=None):
    """`rope`: (cos, sin) tables rotating queries and keys (`rotary.rotary_tables`), or None. `head_mask_N`:
    each head's output scaled by its entry before the output projection (None: all ones). `segments`: the
    kernel's `splash.SegmentMask` (then the fused path runs it instead of the dense `mask`; with the "flash"
    kernel training too, dropout inside), or None.

    Returns the output [B, L, H]; with `output_attentions`, (output, float32 probabilities [B, N, L, L]),
    computed explicitly (the fused kernel returns none).
    """
    cfg = self.config
    shape = (cfg.hidden_size, cfg.num_heads if self.num_heads is None else self.num_heads, cfg.head_dim)
    proj = lambda name: projections.Einsum(cfg, "blh,hnk->blnk", shape, ("embed", "heads", "kv"), ("heads", "kv"),
                                           name=name)
    names = ("activation_batch", "activation_length", "activation_heads", "activation_kv")
    tensor = projections.mesh_shards("heads")
    if cfg.fused_qkv and shape[1] and shape[1] % tensor == 0:
      q_BLNK, k_BLNK, v_BLNK = (_constrain(y, *names) for y in projections.fused_qkv(cfg, x_BLH, shape))
    else:
      q_BLNK, k_BLNK, v_BLNK = (_constrain(proj(n)(x_BLH), *names) for n in ("query", "key", "value"))
    if rope is not None:
      q_BLNK, k_BLNK = rotary.apply_rotary(q_BLNK, rope), rotary.apply_rotary(k_BLNK, rope)
    probs = None
    if shape[1] == 0:  # every head pruned: the output projection's bias is all that is left
      o_BLNK = v_BLNK
      probs = jnp.zeros(x_BLH.shape[:1] + (0,) + x_BLH.shape[1:2] * 2, jnp.float32)
    elif segments is not None and cfg.attention_kernel.startswith("flash") and not output_attentions:
      training = not deterministic and cfg.attention_dropout > 0.0
      key = _DropoutKey(name="Dropout_0")() if training else None
      o_BLNK = flash_dropout.attention(q_BLNK, k_BLNK, v_BLNK, segments, key, cfg.attention_dropout,
                                       cfg.flash_bits)
    elif output_attentions or not (deterministic or cfg.attention_dropout == 0.0):
      o_BLNK, probs = self._explicit_attention(q_BLNK, k_BLNK, v_BLNK, mask, deterministic, output_attentions)
    elif segments is not None:
      o_BLNK = splash.attention(q_BLNK, k_BLNK, v_BLNK, segments)
    else:
      # Lets the backend pick a fused kernel; the softmax is always float32 inside.
      o_BLNK = jax.nn.dot_product_attention(q_BLNK, k_BLNK, v_BLNK, mask=mask)
    if head_mask_N is not None:
      o_BLNK = o_BLNK * jnp.asarray(head_mask_N, o_BLNK.dtype)[:, None]
    o_BLNK = _constrain(o_BLNK, *names)
    out = projections.Einsum(cfg, "blnk,nkh->blh", shape[1:] + shape[:1], ("heads", "kv", "embed"), ("embed",),
                             name="out")
    return (out(o_BLNK), probs) if output_attentions else out(o_BLNK)

  def _explicit_attention(self, q_BLNK, k_BLNK, v_BLNK, mask, deterministic: bool, output_attentions: bool):
    """(context, probabilities), with BERT's dropout on the probabilities when not deterministic
    (jax.nn.dot_product_attention has none). The returned probabilities are before dropout; None when
    `output_attentions` is off and training goes through `softmax_dropout.attend` (cfg.attention_residuals)."""
    cfg = self.config
    # Under a remat policy the layer's backward pass recomputes its attention anyway, and the plain ops
    # moved fewer bytes there (v5e:8x8 BERT-large phase1_tokens, "minimal": 33.4 against 35.8 GB).
    lean = cfg.attention_residuals != "autodiff" and cfg.remat_policy == "none"
    if lean and not (output_attentions or deterministic or cfg.attention_dropout == 0.0):
      # The ops below as one function whose backward pass keeps fewer bytes, with nn.Dropout's key (the
      # same module path, so the same bits).
      key = _DropoutKey(name="Dropout_0")()
      return softmax_dropout.attend(q_BLNK, k_BLNK, v_BLNK, mask, key, cfg.attention_dropout, cfg.residuals_dtype,
                                    cfg.scores_dtype, cfg.dropout_bits, cfg.library_matmuls), None
    probs = softmax_dropout.probabilities(q_BLNK, k_BLNK, mask, cfg.scores_dtype)
    dropped = dropout.Dropout(cfg.attention_dropout, bits=cfg.dropout_bits)(probs, deterministic=deterministic)
    return jnp.einsum("bnqs,bsnk->bqnk", dropped.astype(cfg.dtype), v_BLNK), probs


class _DropoutKey(nn.Module):
  """The "dropout" key an `nn.Dropout` at this module's path would draw (flax folds the path into it)."""

  @nn.compact
  def __call__(self):
    return self.make_rng("dropout")

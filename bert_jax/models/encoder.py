"""BERT encoder (Devlin et al. 2019): embeddings, post-LN Transformer layers, pooler.

Numerically the reference BERT (google-research/bert, Hugging Face `BertModel`): exact erf GELU,
LayerNorm eps 1e-12, softmax and LayerNorm statistics in float32 whatever the compute dtype.
Parameters carry logical axis names only; `config.logical_axis_rules` maps them to mesh axes.

Switches of the same encoder, off by default, composable: ALBERT's factorized embeddings and cross-layer
sharing (`embedding_size`, `share_layers`; Lan et al. 2020, 3.1), RoBERTa's position ids (`position_pad_id`;
Liu et al. 2019 as released in fairseq), DistilBERT's missing token types (`type_vocab_size=0`; Sanh et al.
2019, 2), a left-to-right mask (`causal`), and ModernBERT's (Warner et al. 2024, 2.1): rotary positions
(`rope_theta`, `local_rope_theta`), GeGLU (`geglu`), pre-norm layers (`pre_norm`, `final_norm`), LayerNorms and
linear layers without biases (`norm_bias`, `dense_bias`) and alternating global / sliding-window attention
(`global_attn_every_n_layers`, `local_attention`).

This module holds the Transformer layers (their self-attention is `models/attention.py`'s), their stack and
the encoder that joins them to the embeddings (`models/embeddings.py`) and the pooler.

  cfg = BertConfig.from_preset("base", dtype=jnp.bfloat16)
  out = BertEncoder(cfg).apply({"params": p}, input_ids, input_mask, segment_ids)
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.models import dropout
from bert_jax.models import projections
from bert_jax.models import rotary
from bert_jax.models import splash
from bert_jax.models.attention import SelfAttention
# The config and its Hugging Face keys live in their own modules; these names are re-exported for the callers
# of `encoder`.
from bert_jax.models.config import BertConfig, HF_MODEL_TYPES, PRESETS, REMAT_POLICIES, TABLE6  # noqa: F401
from bert_jax.models.embeddings import BertEmbeddings, default_position_ids, packed_position_ids
from bert_jax.models.hf_keys import GELU_APPROXIMATE, _HF_KEYS  # noqa: F401
from bert_jax.models.layer_norm import layer_norm
# The linear layers live in `projections`; these are used here and by the callers of `encoder`.
from bert_jax.models.projections import constrain as _constrain, dense, dense_init, zeros
# The params' layer layouts (scanned or unrolled) are `layouts`'; re-exported for the callers of `encoder`.
from bert_jax.models.layouts import scan_params, unscan_params  # noqa: F401


def paired_layer_norms(cfg: BertConfig) -> bool:
  """Whether a post-LN layer's norms hand their output to its two users (the next sublayer and the residual)
  as two values (`layer_norm.normalize_pair`), so that the LayerNorm kernel reads their gradients apart."""
  return cfg.layer_norm_kernel != "xla" and not cfg.pre_norm


def gelu(cfg: BertConfig, x):
  """The configured GELU: exact (erf) for "gelu", tanh approximation otherwise."""
  return nn.gelu(x, approximate=GELU_APPROXIMATE[cfg.hidden_act])


def scan_recomputed(cfg: BertConfig, fn):
  """`fn` (elementwise, no params) recomputed in the backward pass when the layers run in a loop
  (`BertConfig.looped_layers`: scanned, fewer than all a trip).

  A scanned stack saves what its backward pass needs into arrays of all layers; autodiff's GELU saves its
  intermediates (the erf and exp terms, [rows, intermediate] each) beside its input, where rematerialised
  it saves the input alone (BERT-large phase 1 on v3:8x8, scanned: 6.66 -> 6.46 GB a core, MFU bound
  53% -> 55%). Unrolled (also over stacked params, `scan_unroll`), XLA fuses the derivative into the backward
  pass's ops by itself, so `fn` is left as it is there unless `recompute_gelu`: then it is recomputed behind `jax.checkpoint`'s CSE barrier (without
  it XLA merges the recomputation back into the forward pass: the same bytes), and the forward pass no longer
  writes the erfc term that three backward fusions read (4 unrolled layers of BERT-large phase 1 on v3:8x8:
  1.0065 -> 0.9981 GB a core; docs/performance.md).
  """
  if cfg.looped_layers:
    return jax.checkpoint(fn, prevent_cse=False)
  return jax.checkpoint(fn) if cfg.recompute_gelu else fn


def attention_mask(input_mask, example_ids=None, causal: bool = False, window: int | None = None):
  """Boolean mask [B, 1, L, L]: keys must be real tokens of the same example as the query (and, when
  causal, at or before it; with a `window`, within window // 2 positions of it, as Hugging Face's
  ModernBERT)."""
  mask_BQK = jnp.broadcast_to(input_mask[:, None, :].astype(bool), input_mask.shape + input_mask.shape[-1:])
  if example_ids is not None:
    # Block-diagonal: packed examples never attend to each other.
    mask_BQK = mask_BQK & (example_ids[:, :, None] == example_ids[:, None, :])
  if causal:
    length = input_mask.shape[-1]
    mask_BQK = mask_BQK & jnp.tril(jnp.ones((length, length), bool))
  if window is not None:
    position = jnp.arange(input_mask.shape[-1])
    mask_BQK = mask_BQK & (jnp.abs(position[:, None] - position[None, :]) <= window // 2)
  return mask_BQK[:, None]


def _pick(flag, on, off):
  """`on` where `flag` else `off`: a Python choice, or an elementwise one under nn.scan (`flag` traced)."""
  if on is None or flag is False:
    return off
  if flag is True:
    return on
  return jax.tree.map(lambda a, b: jnp.where(flag, a, b), on, off)


def layer_kinds(cfg: BertConfig) -> list:
  """[(local, first)] per layer: whether it attends within the sliding window, whether it is layer 0."""
  return [(cfg.local_attention is not None and i % cfg.global_attn_every_n_layers != 0, i == 0)
          for i in range(cfg.num_layers)]


def layer_context(cfg: BertConfig, input_mask, example_ids, position_ids) -> dict:
  """What every layer's attention reads: the mask and RoPE tables (or None) of global layers ("mask",
  "rope") and of sliding-window layers ("local_mask", "local_rope"; None without them), and with a splash
  `attention_kernel` the kernel's `splash.SegmentMask` ("segments"; else None)."""
  rope = lambda theta: None if cfg.rope_theta is None else rotary.rotary_tables(position_ids, cfg.head_dim, theta)
  local = cfg.local_attention is not None
  segments = None
  if cfg.attention_kernel != "xla":   # the kernel's mask; the dense ones remain for the explicit path
    segments = splash.segment_mask(cfg.attention_kernel, input_mask, example_ids, cfg.local_attention, cfg.causal)
  return {"mask": attention_mask(input_mask, example_ids, cfg.causal), "rope": rope(cfg.rope_theta),
          "local_mask": attention_mask(input_mask, example_ids, cfg.causal, cfg.local_attention) if local else None,
          "local_rope": rope(cfg.local_rope_theta or cfg.rope_theta) if local else None, "segments": segments}


def _as_context(context) -> dict:
  """`layer_context`'s dict, also from a bare attention mask (global attention without RoPE)."""
  if isinstance(context, dict):
    return context
  return {"mask": context, "rope": None, "local_mask": None, "local_rope": None, "segments": None}


class BertLayer(nn.Module):
  """One Transformer layer, post-LN (BERT) or pre-LN (`pre_norm`). Returns (x, x or None) so that it can be
  the body of nn.scan.

  `context`: `layer_context` (or an attention mask alone); `kind`: (local, first) of `layer_kinds`, Python
  bools, or arrays under nn.scan (then layer 0's unused attention norm has params too, so that every step
  has the same); `head_mask`: [num_heads] scales of the heads' outputs, or None. The second output is
  (x or None, attention probabilities [B, N, L, L] or None), as output_hidden_states and output_attentions ask.
  """
  config: BertConfig
  output_attentions: bool = False
  num_heads: int | None = None   # after pruning; None: config.num_heads
  # Sublayers owned by the stack and applied by every layer (`shared_sublayer`); None: this layer's own.
  shared_attention: nn.Module | None = None
  shared_intermediate: nn.Module | None = None
  shared_output: nn.Module | None = None

  @nn.compact
  def __call__(self, x, context, deterministic: bool, output_hidden_states: bool, kind=(False, False),
               head_mask=None):
    cfg = self.config
    context, (local, first) = _as_context(context), kind
    mask, rope = _pick(local, context["local_mask"], context["mask"]), _pick(local, context["local_rope"],
                                                                              context["rope"])
    drop = lambda h: dropout.Dropout(cfg.hidden_dropout, bits=cfg.dropout_bits)(h, deterministic=deterministic)
    constrain = lambda h: _constrain(h, "activation_batch", "activation_length", "activation_embed")
    self_attention = self.shared_attention or SelfAttention(cfg, self.num_heads, name="attention")
    probs = []

    segments = context.get("segments")
    if segments is not None:   # the kernel's mask, told whether this layer is a sliding-window one
      segments = segments.replace(local=local)

    def attention(h, mask, rope, deterministic):
      out = self_attention(h, mask, rope, deterministic, head_mask, self.output_attentions, segments)
      if self.output_attentions:
        out, p = out
        probs.append(p)
      return out

    if cfg.pre_norm:
      # Layer 0 reads the embedding norm's output as it is (ModernBERT's attn_norm is Identity there).
      h = x if first is True else _pick(first, x, layer_norm(cfg, "attention_layer_norm", True)(x))
      x = constrain(x + drop(attention(h, mask, rope, deterministic)))
      x = constrain(x + drop(_feed_forward(self, layer_norm(cfg, "output_layer_norm", True)(x))))
    elif isinstance(x, tuple):   # `paired_layer_norms`: each norm's output handed to its two users apart
      x_in, x_res = x
      h = attention(constrain(x_in), mask, rope, deterministic)
      y_in, y_res = layer_norm(cfg, "attention_layer_norm", True)(x_res + drop(h), pair=True)
      y_res = y_res + drop(_feed_forward(self, constrain(y_in)))
      y_in, y_res = layer_norm(cfg, "output_layer_norm", True)(y_res, pair=True)
      x = (constrain(y_in), constrain(y_res))
      return x, (x[0] if output_hidden_states else None, probs[0] if self.output_attentions else None)
    else:
      h = attention(x, mask, rope, deterministic)
      x = constrain(layer_norm(cfg, "attention_layer_norm")(x + drop(h)))
      x = constrain(layer_norm(cfg, "output_layer_norm")(x + drop(_feed_forward(self, x))))
    return x, (x if output_hidden_states else None, probs[0] if self.output_attentions else None)


def _feed_forward(layer: nn.Module, h):
  """`layer`'s intermediate dense layer, its GELU (or GeGLU) and its output dense layer, made in its compact
  `__call__` (a function rather than a method, which flax would give a name scope of its own in op names)."""
  cfg = layer.config
  layer_dense = functools.partial(dense, cfg, in_layer=True)
  h = (layer.shared_intermediate or layer_dense(cfg.intermediate_size * (2 if cfg.geglu else 1), ("embed", "mlp"),
                                                "intermediate"))(h)
  if cfg.geglu:  # the input half first, then the gate, as Hugging Face's ModernBertMLP
    h, gate = jnp.split(h, 2, axis=-1)
    h = scan_recomputed(cfg, lambda h, gate: gelu(cfg, h) * gate)(h, gate)
  else:
    h = scan_recomputed(cfg, functools.partial(gelu, cfg))(h)
  h = _constrain(h, "activation_batch", "activation_length", "activation_mlp")
  return (layer.shared_output or layer_dense(cfg.hidden_size, ("mlp", "embed"), "output"))(h)


class BertLayerStack(nn.Module):
  """num_layers BertLayers: params `layer_0..layer_{N-1}`, or `layers` with a leading axis when scanned;
  with share_layers, one set `shared_layer` in both layouts. Under scan, each layer's kind (global or
  sliding-window, first or not) is a scanned input."""
  config: BertConfig

  @nn.compact
  def __call__(self, x, context, deterministic: bool, output_hidden_states: bool, output_attentions: bool = False,
               head_mask=None):
    """`context`: `layer_context`, or an attention mask alone (global attention without RoPE); `head_mask`:
    [num_layers, num_heads] or None. Returns (x, [each layer's output] or [], [each layer's attention
    probabilities] or [])."""
    cfg = self.config
    layer = BertLayer
    kinds = layer_kinds(cfg)
    paired = paired_layer_norms(cfg)
    if paired:   # each layer takes and gives its stream as (the sublayer's input, the residual's)
      x = (x, x)
    if cfg.remat_policy != "none":
      # Arguments counted with self: deterministic and output_hidden_states are Python bools, and so is each
      # layer's kind when the layers are not scanned.
      layer = nn.remat(layer, policy=cfg.remat_checkpoint_policy, prevent_cse=not cfg.looped_layers,
                       static_argnums=(3, 4) if cfg.scan_layers else (3, 4, 5))
    if cfg.scan_layers:
      in_axes = (nn.broadcast, nn.broadcast, nn.broadcast, 0, nn.broadcast if head_mask is None else 0)
      if cfg.share_layers:  # the one parameter set is broadcast to every step
        stack = nn.scan(layer, variable_broadcast="params", split_rngs={"params": False, "dropout": True},
                        in_axes=in_axes, length=cfg.num_layers, unroll=cfg.scan_unroll)
      else:
        stack = nn.scan(layer, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
                        in_axes=in_axes, length=cfg.num_layers, unroll=cfg.scan_unroll,
                        metadata_params={nn.PARTITION_NAME: "layers"})
      name = "shared_layer" if cfg.share_layers else "layers"
      kinds_N = tuple(jnp.array(k) for k in zip(*kinds))
      x, (hidden, probs) = stack(cfg, output_attentions, name=name)(x, context, deterministic, output_hidden_states,
                                                                    kinds_N, head_mask)
      x = x[0] if paired else x
      return x, (list(hidden) if output_hidden_states else []), (list(probs) if output_attentions else [])
    shared = layer(cfg, output_attentions, name="shared_layer") if cfg.share_layers else None
    sublayers = _shared_sublayers(cfg)
    hidden, probs = [], []
    for i in range(cfg.num_layers):
      block = shared if cfg.share_layers else layer(cfg, output_attentions, cfg.layer_num_heads(i), name=f"layer_{i}", **sublayers)
      x, (h, p) = block(x, context, deterministic, output_hidden_states, kinds[i],
                        None if head_mask is None else head_mask[i])
      hidden.append(h)
      probs.append(p)
    x = x[0] if paired else x
    return x, (hidden if output_hidden_states else []), (probs if output_attentions else [])


def _shared_sublayers(cfg: BertConfig) -> dict:
  """The sublayer every layer applies (`shared_sublayer`), created in the calling (stack's) scope."""
  if cfg.shared_sublayer == "attention":
    return {"shared_attention": SelfAttention(cfg, name="shared_attention")}
  if cfg.shared_sublayer == "ffn":
    return {"shared_intermediate": dense(cfg, cfg.intermediate_size * (2 if cfg.geglu else 1), ("embed", "mlp"),
                                          "shared_intermediate"),
            "shared_output": dense(cfg, cfg.hidden_size, ("mlp", "embed"), "shared_output")}
  return {}


class BertEncoder(nn.Module):
  """The BERT encoder; see docs/architecture.md for the call contract."""
  config: BertConfig

  def setup(self):
    cfg = self.config
    self.embeddings = BertEmbeddings(cfg)
    self.encoder = BertLayerStack(cfg)
    if cfg.final_norm:
      self.final_layer_norm = layer_norm(cfg, "final_layer_norm")
    self.pooler = projections.linear(cfg, cfg.hidden_size, dense_init(cfg, ("embed", "mlp")), zeros(("mlp",)))

  def __call__(self, input_ids, input_mask=None, segment_ids=None, *, position_ids=None, example_ids=None,
               pooled_positions=None, deterministic: bool = True, output_hidden_states: bool = False,
               pool: bool = True, output_attentions: bool = False, head_mask=None):
    """Returns {"sequence_output": [B, L, H], "pooled_output": [B, H] or [B, K, H], "hidden_states"}.

    `hidden_states` is [num_layers + 1, B, L, H] (embeddings first, after any projection to H; the last
    layer's output before any `final_norm`, as Hugging Face's ModernBERT) when output_hidden_states, else
    None. Given position_ids are used as they are (no RoBERTa offset added), but with `example_ids` (packing)
    they are each example's offsets (`packed_position_ids`).
    `pool=False`: no pooler (its params are then never created; ELECTRA, DistilBERT), "pooled_output" None.
    `output_attentions`: "attentions" is float32 [num_layers, B, num_heads, L, L], each real query's
    probabilities over the keys (0 on keys it may not attend to), all 0 on padded queries; pruned heads
    (`pruned_heads`) are rows of 0 in their original place. Computed without the fused kernel: for analysis.
    `head_mask`: [num_layers, num_heads], each head's output scaled by its entry (Michel et al. 2019); the
    model must have all its heads.
    """
    cfg = self.config
    if head_mask is not None and cfg.pruned_heads:
      raise ValueError("head_mask needs every head: this model has pruned_heads")
    if input_mask is None:
      input_mask = jnp.ones_like(input_ids)
    if segment_ids is None:
      segment_ids = jnp.zeros_like(input_ids)
    position_ids = packed_position_ids(cfg, position_ids, example_ids)
    x = self.embeddings(input_ids, segment_ids, position_ids, deterministic)
    if position_ids is None:
      position_ids = default_position_ids(self.config, input_ids)
    x_emb = x
    context = layer_context(self.config, input_mask, example_ids, position_ids)
    x, hidden, probs = self.encoder(x, context, deterministic, output_hidden_states, output_attentions, head_mask)
    if self.config.final_norm:
      x = self.final_layer_norm(x)
    pooled = None
    if pool:
      if pooled_positions is None:
        first_BH = x[:, 0]  # [CLS]
      else:
        first_BH = jnp.take_along_axis(x, pooled_positions[..., None], axis=1)  # [B, K, H]
      pooled = jnp.tanh(self.pooler(first_BH))
    return {
        "sequence_output": x,
        "pooled_output": pooled,
        "hidden_states": jnp.stack([x_emb, *hidden]) if output_hidden_states else None,
        "attentions": _attentions(cfg, probs, input_mask) if output_attentions else None,
    }

  def word_embeddings(self):
    """The [vocab, embedding_dim] word-embedding table (tied MLM decoder)."""
    return self.embeddings.word_embeddings.embedding


def _attentions(cfg: BertConfig, probs: list, input_mask):
  """Each layer's probabilities [B, kept heads, L, L] -> [num_layers, B, num_heads, L, L], pruned heads 0,
  padded queries 0."""
  full = []
  for i, p in enumerate(probs):
    if cfg.pruned_heads:
      p = jnp.zeros(p.shape[:1] + (cfg.num_heads,) + p.shape[2:], p.dtype).at[:, list(cfg.kept_heads(i))].set(p)
    full.append(p * input_mask[:, None, :, None].astype(p.dtype))
  return jnp.stack(full)

"""BERT encoder (Devlin et al. 2019): embeddings, post-LN Transformer layers, pooler.

Numerically the reference BERT (google-research/bert, Hugging Face `BertModel`): exact erf GELU,
LayerNorm eps 1e-12, softmax and LayerNorm statistics in float32 whatever the compute dtype.
Parameters carry logical axis names only; `config.logical_axis_rules` maps them to mesh axes.

Switches of the same encoder, off by default, composable: ALBERT's factorized embeddings and cross-layer
sharing (`embedding_size`, `share_layers`; Lan et al. 2020, 3.1), RoBERTa's position ids (`position_pad_id`;
Liu et al. 2019 as released in fairseq), DistilBERT's missing token types (`type_vocab_size=0`; Sanh et al.
2019, 2) and a left-to-right mask (`causal`).

  cfg = BertConfig.from_preset("base", dtype=jnp.bfloat16)
  out = BertEncoder(cfg).apply({"params": p}, input_ids, input_mask, segment_ids)
"""

import dataclasses
import re
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

# (num_layers, hidden_size, num_heads). tiny..medium: Turc et al. 2019 ("Well-Read Students"),
# base/large: Devlin et al. 2019, 3. Intermediate size is always 4 * hidden.
PRESETS = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}
# Devlin et al. 2019, Table 6 (ablation over model size), named like Google's releases.
TABLE6 = ("L-3_H-768_A-12", "L-6_H-768_A-3", "L-6_H-768_A-12", "L-12_H-768_A-12",
          "L-12_H-1024_A-16", "L-24_H-1024_A-16")
_GRID_NAME = re.compile(r"L-(\d+)_H-(\d+)_A-(\d+)")

REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,           # recompute the whole layer
    "dots_saveable": jax.checkpoint_policies.dots_saveable,    # keep every matmul output
    "minimal": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,  # keep weight matmuls only
}

# BertConfig field <-> Hugging Face config.json key.
_HF_KEYS = {
    "vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads", "intermediate_size": "intermediate_size",
    "max_position_embeddings": "max_position_embeddings", "type_vocab_size": "type_vocab_size",
    "hidden_dropout": "hidden_dropout_prob", "attention_dropout": "attention_probs_dropout_prob",
    "initializer_range": "initializer_range", "layer_norm_eps": "layer_norm_eps",
    "hidden_act": "hidden_act",
}
_GELU_APPROXIMATE = {"gelu": False, "gelu_new": True, "gelu_pytorch_tanh": True}
HF_MODEL_TYPES = ("bert", "albert", "roberta", "distilbert", "electra")
# DistilBertConfig key -> BertConfig field, and transformers' defaults where a key is absent (DistilBERT's
# LayerNorm eps is fixed at 1e-12 in its modules, ours by default).
_DISTILBERT_KEYS = {"vocab_size": "vocab_size", "dim": "hidden_size", "n_layers": "num_layers", "n_heads": "num_heads",
                    "hidden_dim": "intermediate_size", "max_position_embeddings": "max_position_embeddings",
                    "activation": "hidden_act", "dropout": "hidden_dropout", "attention_dropout": "attention_dropout",
                    "initializer_range": "initializer_range"}
_DISTILBERT_DEFAULTS = {"vocab_size": 30522, "dim": 768, "n_layers": 6, "n_heads": 12, "hidden_dim": 3072,
                        "max_position_embeddings": 512, "activation": "gelu", "dropout": 0.1,
                        "attention_dropout": 0.1, "initializer_range": 0.02}
# transformers' ElectraConfig defaults (ELECTRA-small's discriminator) for the keys that differ from BERT's.
_ELECTRA_DEFAULTS = {"hidden_size": 256, "num_attention_heads": 4, "intermediate_size": 1024, "embedding_size": 128}


@dataclasses.dataclass(frozen=True)
class BertConfig:
  """Hyperparameters of a BERT encoder; defaults are BERT-base."""
  vocab_size: int = 30522
  hidden_size: int = 768
  num_layers: int = 12
  num_heads: int = 12
  intermediate_size: int = 3072
  max_position_embeddings: int = 512
  type_vocab_size: int = 2      # 0: no token-type embeddings (DistilBERT)
  hidden_act: str = "gelu"  # exact erf GELU, as in BERT; "gelu_new" is the tanh approximation
  hidden_dropout: float = 0.1
  attention_dropout: float = 0.1
  initializer_range: float = 0.02
  layer_norm_eps: float = 1e-12
  dtype: Any = jnp.float32        # compute
  param_dtype: Any = jnp.float32  # storage
  scan_layers: bool = False       # one compiled layer body under nn.scan; params get a "layers" axis
  remat_policy: str = "none"      # "none" or a key of REMAT_POLICIES
  # ALBERT: embeddings (and their LayerNorm) of this width, projected to hidden_size; the MLM head maps back
  # to it. None: no projection (BERT). Set equal to hidden_size, the projection is still there (as in ALBERT).
  embedding_size: int | None = None
  share_layers: bool = False      # ALBERT: every layer applies one parameter set (`shared_layer`)
  causal: bool = False            # query i attends to keys <= i only (a left-to-right LM)
  # RoBERTa: default position ids count real tokens from position_pad_id + 1; padding (this id in input_ids)
  # gets position_pad_id (HF `create_position_ids_from_input_ids`). None: positions 0..L-1 (BERT).
  position_pad_id: int | None = None

  def __post_init__(self):
    # Accept dtype names ("bfloat16") as they come from ConfigDicts and command lines.
    object.__setattr__(self, "dtype", jnp.dtype(self.dtype))
    object.__setattr__(self, "param_dtype", jnp.dtype(self.param_dtype))
    if self.hidden_size % self.num_heads:
      raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of num_heads {self.num_heads}")
    if self.hidden_act not in _GELU_APPROXIMATE:
      raise ValueError(f"hidden_act {self.hidden_act!r} not supported; one of {sorted(_GELU_APPROXIMATE)}")
    if self.remat_policy != "none" and self.remat_policy not in REMAT_POLICIES:
      raise ValueError(f"remat_policy {self.remat_policy!r}; one of {['none', *REMAT_POLICIES]}")

  @property
  def head_dim(self) -> int:
    """Size of one attention head (hidden_size // num_heads)."""
    return self.hidden_size // self.num_heads

  @property
  def embedding_dim(self) -> int:
    """Width of the embedding tables and of the MLM head's transform: embedding_size or hidden_size."""
    return self.hidden_size if self.embedding_size is None else self.embedding_size

  @property
  def model_type(self) -> str:
    """The Hugging Face family this config is written as (config.json `model_type`, tensor names)."""
    if self.embedding_size is not None or self.share_layers:
      return "albert"
    if self.position_pad_id is not None:
      return "roberta"
    return "distilbert" if self.type_vocab_size == 0 else "bert"

  @classmethod
  def from_preset(cls, name: str, **overrides) -> "BertConfig":
    """A paper size: tiny/mini/small/medium/base/large or a grid name like "L-6_H-768_A-12"."""
    if name in PRESETS:
      layers, hidden, heads = PRESETS[name]
    elif match := _GRID_NAME.fullmatch(name):
      layers, hidden, heads = map(int, match.groups())
    else:
      raise ValueError(f"unknown preset {name!r}; one of {sorted(PRESETS)} or a name like {TABLE6[0]!r}")
    fields = dict(num_layers=layers, hidden_size=hidden, num_heads=heads, intermediate_size=4 * hidden)
    return cls(**{**fields, **overrides})

  @classmethod
  def from_hf_dict(cls, d: dict, **overrides) -> "BertConfig":
    """From a Hugging Face config.json (model_type bert, albert, roberta, distilbert or electra; none: a
    Google bert_config.json).

    Unknown keys are ignored; a family or variant this encoder does not implement is a ValueError. An
    ELECTRA config reads as BERT (or, with an embedding size other than the hidden size, as ALBERT's
    projection): its tensor names are the caller's to know (`checkpoints_hf.load_hf` reads config.json).
    """
    if d.get("position_embedding_type", "absolute") != "absolute":
      raise ValueError(f"position_embedding_type {d['position_embedding_type']!r} is not supported")
    model_type = d.get("model_type", "bert")
    if model_type not in HF_MODEL_TYPES:
      raise ValueError(f"model_type {model_type!r} is not supported; one of {list(HF_MODEL_TYPES)}")
    if model_type == "distilbert":
      return cls(**{**_distilbert_fields(d), **overrides})
    if model_type == "electra":
      d = {**_ELECTRA_DEFAULTS, **d}
    fields = {f: d[k] for f, k in _HF_KEYS.items() if k in d}
    fields["causal"] = bool(d.get("is_decoder", False))
    if model_type == "albert":
      fields.update(_albert_fields(d))
    elif model_type == "roberta":
      fields["position_pad_id"] = d.get("pad_token_id", 1)  # transformers' RobertaConfig default
    elif model_type == "electra":  # the projection exists only when the widths differ (ElectraEmbeddings)
      fields["embedding_size"] = None if d["embedding_size"] == d["hidden_size"] else d["embedding_size"]
    return cls(**{**fields, **overrides})

  def to_hf_dict(self) -> dict:
    """A config.json of `model_type` (BertConfig, AlbertConfig, RobertaConfig or DistilBertConfig in
    transformers; ELECTRA's is `checkpoints_hf.electra_hf_dict`)."""
    if self.model_type == "distilbert":
      return self._distilbert_hf_dict()
    d = {k: getattr(self, f) for f, k in _HF_KEYS.items()}
    d.update(model_type="bert", architectures=["BertForPreTraining"], pad_token_id=0,
             position_embedding_type="absolute")
    if self.causal:
      d["is_decoder"] = True  # BertModel and RobertaModel mask causally then
    if self.model_type == "albert":
      if self.position_pad_id is not None:
        raise ValueError("no Hugging Face family has both ALBERT's embeddings or sharing and RoBERTa's positions")
      d.update(model_type="albert", architectures=["AlbertForPreTraining"], embedding_size=self.embedding_size,
               num_hidden_groups=1 if self.share_layers else self.num_layers, inner_group_num=1)
    elif self.model_type == "roberta":
      d.update(model_type="roberta", architectures=["RobertaForMaskedLM"], pad_token_id=self.position_pad_id)
    return d

  def _distilbert_hf_dict(self) -> dict:
    """A DistilBertConfig dict: no token types, learned positions, LayerNorm eps 1e-12, bidirectional."""
    if self.causal or self.layer_norm_eps != 1e-12:
      raise ValueError(f"transformers' DistilBERT (type_vocab_size 0) has no causal mask and LayerNorm eps 1e-12; "
                       f"got causal={self.causal}, layer_norm_eps={self.layer_norm_eps}")
    d = {k: getattr(self, f) for k, f in _DISTILBERT_KEYS.items()}
    d.update(model_type="distilbert", architectures=["DistilBertForMaskedLM"], pad_token_id=0,
             sinusoidal_pos_embds=False)
    return d


def _distilbert_fields(d: dict) -> dict:
  """BertConfig fields of a DistilBertConfig dict; sinusoidal positions and activations other than GELU are
  errors."""
  if d.get("sinusoidal_pos_embds", False):
    raise ValueError("DistilBERT with sinusoidal_pos_embds is not supported: only learned position embeddings")
  d = {**_DISTILBERT_DEFAULTS, **d}
  if d["activation"] not in _GELU_APPROXIMATE:
    raise ValueError(f"DistilBERT activation {d['activation']!r} is not supported; one of {sorted(_GELU_APPROXIMATE)}")
  return {**{f: d[k] for k, f in _DISTILBERT_KEYS.items()}, "type_vocab_size": 0}


def _albert_fields(d: dict) -> dict:
  """BertConfig fields of an AlbertConfig dict: one group shared by all layers, or one group per layer."""
  layers, groups = d.get("num_hidden_layers", 12), d.get("num_hidden_groups", 1)
  if d.get("inner_group_num", 1) != 1 or groups not in (1, layers):
    raise ValueError(f"ALBERT with num_hidden_groups {groups} and inner_group_num {d.get('inner_group_num')} is "
                     "not supported: only one layer per group, in one group or one group per layer")
  # transformers' AlbertConfig defaults where a key is absent.
  return {"embedding_size": d.get("embedding_size", 128), "share_layers": groups == 1,
          "hidden_act": d.get("hidden_act", "gelu_new")}


def dense_init(cfg: BertConfig, names: tuple):
  """Truncated normal with stddev initializer_range (google-research/bert), with logical axis names."""
  return nn.with_logical_partitioning(nn.initializers.truncated_normal(cfg.initializer_range), names)


def zeros(names: tuple):
  """Zeros with logical axis names (biases)."""
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), names)


def layer_norm(cfg: BertConfig, name: str) -> nn.LayerNorm:
  """LayerNorm over `embed` with BERT's epsilon."""
  # Statistics are computed in float32 by flax whatever cfg.dtype is; the exact two-pass variance
  # matches the reference to 1e-6.
  return nn.LayerNorm(epsilon=cfg.layer_norm_eps, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                      use_fast_variance=False, name=name,
                      scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("embed",)),
                      bias_init=zeros(("embed",)))


def _constrain(x, *names):
  return nn.with_logical_constraint(x, names)


def gelu(cfg: BertConfig, x):
  """The configured GELU: exact (erf) for "gelu", tanh approximation otherwise."""
  return nn.gelu(x, approximate=_GELU_APPROXIMATE[cfg.hidden_act])


def attention_mask(input_mask, example_ids=None, causal: bool = False):
  """Boolean mask [B, 1, L, L]: keys must be real tokens of the same example as the query (and, when
  causal, at or before it)."""
  mask_BQK = jnp.broadcast_to(input_mask[:, None, :].astype(bool), input_mask.shape + input_mask.shape[-1:])
  if example_ids is not None:
    # Block-diagonal: packed examples never attend to each other.
    mask_BQK = mask_BQK & (example_ids[:, :, None] == example_ids[:, None, :])
  if causal:
    length = input_mask.shape[-1]
    mask_BQK = mask_BQK & jnp.tril(jnp.ones((length, length), bool))
  return mask_BQK[:, None]


def default_position_ids(cfg: BertConfig, input_ids):
  """Position ids when none are given: 0..L-1, or RoBERTa's (see `BertConfig.position_pad_id`)."""
  length = input_ids.shape[-1]
  offset = 0 if cfg.position_pad_id is None else cfg.position_pad_id + 1
  if length + offset > cfg.max_position_embeddings:
    # Out-of-range ids would embed as NaN (jnp.take fills), silently, not fail.
    after = f" less the {offset} ids RoBERTa's positions start after" if offset else ""
    raise ValueError(f"sequence length {length} exceeds max_position_embeddings "
                     f"{cfg.max_position_embeddings}{after}")
  if cfg.position_pad_id is None:
    return jnp.broadcast_to(jnp.arange(length), input_ids.shape)
  real = (input_ids != cfg.position_pad_id).astype(jnp.int32)
  return jnp.cumsum(real, axis=-1) * real + cfg.position_pad_id


class BertEmbeddings(nn.Module):
  """Word + position + token-type embeddings, LayerNorm, dropout (then ALBERT's projection to hidden_size)."""
  config: BertConfig

  def setup(self):
    cfg = self.config
    embed = lambda n, names, name: nn.Embed(n, cfg.embedding_dim, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                                            embedding_init=dense_init(cfg, names), name=name)
    self.word_embeddings = embed(cfg.vocab_size, ("vocab", "embed"), "word_embeddings")
    self.position_embeddings = embed(cfg.max_position_embeddings, ("position", "embed"), "position_embeddings")
    if cfg.type_vocab_size:   # 0: no token types (DistilBERT)
      self.token_type_embeddings = embed(cfg.type_vocab_size, ("type_vocab", "embed"), "token_type_embeddings")
    self.layer_norm = layer_norm(cfg, "layer_norm")
    self.dropout = nn.Dropout(cfg.hidden_dropout)
    if cfg.embedding_size is not None:
      # ALBERT's `embedding_hidden_mapping_in`; the small embedding width stays unsharded.
      self.projection = nn.Dense(cfg.hidden_size, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                                 kernel_init=dense_init(cfg, (None, "embed")), bias_init=zeros(("embed",)))

  def __call__(self, input_ids, segment_ids, position_ids, deterministic: bool):
    x = self.embed(input_ids, segment_ids, position_ids, deterministic)
    if self.config.embedding_size is not None:
      x = self.projection(x)
    return _constrain(x, "activation_batch", "activation_length", "activation_embed")

  def embed(self, input_ids, segment_ids, position_ids, deterministic: bool):
    """The embeddings before any projection to hidden_size: [B, L, embedding_dim]."""
    x = self.word_embeddings(input_ids) + self.position_embeddings(position_ids)
    if self.config.type_vocab_size:
      x = x + self.token_type_embeddings(segment_ids)
    return self.dropout(self.layer_norm(x), deterministic=deterministic)


class _Einsum(nn.Module):
  """Projection `einsum(equation, x, kernel) + bias`, bias over the kernel's trailing axes.

  (nn.DenseGeneral initialises a flattened kernel and trips over rank-3 logical constraints.)
  """
  config: BertConfig
  equation: str
  kernel_shape: tuple
  kernel_axes: tuple
  bias_axes: tuple

  @nn.compact
  def __call__(self, x):
    cfg = self.config
    kernel = self.param("kernel", dense_init(cfg, self.kernel_axes), self.kernel_shape, cfg.param_dtype)
    bias_shape = self.kernel_shape[len(self.kernel_shape) - len(self.bias_axes):]
    bias = self.param("bias", zeros(self.bias_axes), bias_shape, cfg.param_dtype)
    x, kernel, bias = nn.dtypes.promote_dtype(x, kernel, bias, dtype=cfg.dtype)
    return jnp.einsum(self.equation, x, kernel) + bias


class SelfAttention(nn.Module):
  """Multi-head self-attention with output projection (no residual)."""
  config: BertConfig

  @nn.compact
  def __call__(self, x_BLH, mask, deterministic: bool):
    cfg = self.config
    shape = (cfg.hidden_size, cfg.num_heads, cfg.head_dim)
    proj = lambda name: _Einsum(cfg, "blh,hnk->blnk", shape, ("embed", "heads", "kv"), ("heads", "kv"), name=name)
    names = ("activation_batch", "activation_length", "activation_heads", "activation_kv")
    q_BLNK, k_BLNK, v_BLNK = (_constrain(proj(n)(x_BLH), *names) for n in ("query", "key", "value"))
    if deterministic or cfg.attention_dropout == 0.0:
      # Lets the backend pick a fused kernel; the softmax is always float32 inside.
      o_BLNK = jax.nn.dot_product_attention(q_BLNK, k_BLNK, v_BLNK, mask=mask)
    else:
      o_BLNK = self._attention_with_dropout(q_BLNK, k_BLNK, v_BLNK, mask)
    o_BLNK = _constrain(o_BLNK, *names)
    out = _Einsum(cfg, "blnk,nkh->blh", shape[1:] + shape[:1], ("heads", "kv", "embed"), ("embed",), name="out")
    return out(o_BLNK)

  def _attention_with_dropout(self, q_BLNK, k_BLNK, v_BLNK, mask):
    # jax.nn.dot_product_attention has no dropout on the probabilities (BERT's attention dropout).
    cfg = self.config
    logits = jnp.einsum("bqnk,bsnk->bnqs", q_BLNK, k_BLNK, preferred_element_type=jnp.float32)
    logits = jnp.where(mask, logits / np.sqrt(cfg.head_dim), jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(logits, axis=-1)  # float32 on purpose
    probs = nn.Dropout(cfg.attention_dropout)(probs, deterministic=False)
    return jnp.einsum("bnqs,bsnk->bqnk", probs.astype(cfg.dtype), v_BLNK)


class BertLayer(nn.Module):
  """One post-LN Transformer layer. Returns (x, x or None) so that it can be the body of nn.scan."""
  config: BertConfig

  @nn.compact
  def __call__(self, x, mask, deterministic: bool, output_hidden_states: bool):
    cfg = self.config
    dense = lambda n, names, name: nn.Dense(n, dtype=cfg.dtype, param_dtype=cfg.param_dtype, name=name,
                                            kernel_init=dense_init(cfg, names), bias_init=zeros(names[-1:]))
    dropout = nn.Dropout(cfg.hidden_dropout)
    h = SelfAttention(cfg, name="attention")(x, mask, deterministic)
    x = layer_norm(cfg, "attention_layer_norm")(x + dropout(h, deterministic=deterministic))
    x = _constrain(x, "activation_batch", "activation_length", "activation_embed")
    h = gelu(cfg, dense(cfg.intermediate_size, ("embed", "mlp"), "intermediate")(x))
    h = _constrain(h, "activation_batch", "activation_length", "activation_mlp")
    h = dense(cfg.hidden_size, ("mlp", "embed"), "output")(h)
    x = layer_norm(cfg, "output_layer_norm")(x + dropout(h, deterministic=deterministic))
    x = _constrain(x, "activation_batch", "activation_length", "activation_embed")
    return x, (x if output_hidden_states else None)


class BertLayerStack(nn.Module):
  """num_layers BertLayers: params `layer_0..layer_{N-1}`, or `layers` with a leading axis when scanned;
  with share_layers, one set `shared_layer` in both layouts."""
  config: BertConfig

  @nn.compact
  def __call__(self, x, mask, deterministic: bool, output_hidden_states: bool):
    cfg = self.config
    layer = BertLayer
    if cfg.remat_policy != "none":
      # Arguments counted with self: deterministic and output_hidden_states are Python bools.
      layer = nn.remat(layer, policy=REMAT_POLICIES[cfg.remat_policy], prevent_cse=not cfg.scan_layers,
                       static_argnums=(3, 4))
    if cfg.scan_layers:
      if cfg.share_layers:  # the one parameter set is broadcast to every step
        stack = nn.scan(layer, variable_broadcast="params", split_rngs={"params": False, "dropout": True},
                        in_axes=(nn.broadcast, nn.broadcast, nn.broadcast), length=cfg.num_layers)
      else:
        stack = nn.scan(layer, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
                        in_axes=(nn.broadcast, nn.broadcast, nn.broadcast), length=cfg.num_layers,
                        metadata_params={nn.PARTITION_NAME: "layers"})
      name = "shared_layer" if cfg.share_layers else "layers"
      x, hidden = stack(cfg, name=name)(x, mask, deterministic, output_hidden_states)
      return x, (list(hidden) if output_hidden_states else [])
    shared = layer(cfg, name="shared_layer") if cfg.share_layers else None
    hidden = []
    for i in range(cfg.num_layers):
      block = shared if cfg.share_layers else layer(cfg, name=f"layer_{i}")
      x, h = block(x, mask, deterministic, output_hidden_states)
      hidden.append(h)
    return x, (hidden if output_hidden_states else [])


class BertEncoder(nn.Module):
  """The BERT encoder; see docs/architecture.md for the call contract."""
  config: BertConfig

  def setup(self):
    cfg = self.config
    self.embeddings = BertEmbeddings(cfg)
    self.encoder = BertLayerStack(cfg)
    self.pooler = nn.Dense(cfg.hidden_size, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                           kernel_init=dense_init(cfg, ("embed", "mlp")), bias_init=zeros(("mlp",)))

  def __call__(self, input_ids, input_mask=None, segment_ids=None, *, position_ids=None, example_ids=None,
               pooled_positions=None, deterministic: bool = True, output_hidden_states: bool = False,
               pool: bool = True):
    """Returns {"sequence_output": [B, L, H], "pooled_output": [B, H] or [B, K, H], "hidden_states"}.

    `hidden_states` is [num_layers + 1, B, L, H] (embeddings first, after any projection to H) when
    output_hidden_states, else None. Given position_ids are used as they are (no RoBERTa offset added).
    `pool=False`: no pooler (its params are then never created; ELECTRA, DistilBERT), "pooled_output" None.
    """
    if input_mask is None:
      input_mask = jnp.ones_like(input_ids)
    if segment_ids is None:
      segment_ids = jnp.zeros_like(input_ids)
    if position_ids is None:
      position_ids = default_position_ids(self.config, input_ids)
    x = self.embeddings(input_ids, segment_ids, position_ids, deterministic)
    x_emb = x
    mask = attention_mask(input_mask, example_ids, self.config.causal)
    x, hidden = self.encoder(x, mask, deterministic, output_hidden_states)
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
    }

  def word_embeddings(self):
    """The [vocab, embedding_dim] word-embedding table (tied MLM decoder)."""
    return self.embeddings.word_embeddings.embedding


def _map_layer_dicts(tree, fn):
  if not isinstance(tree, dict):
    return tree
  tree = fn(tree)
  return {k: _map_layer_dicts(v, fn) for k, v in tree.items()}


def scan_params(params):
  """Unscanned -> scanned layout: every `layer_0..layer_{N-1}` group becomes `layers` [N, ...]."""
  def stack(d):
    n = sum(1 for k in d if re.fullmatch(r"layer_\d+", k))
    if not n:
      return d
    layers = [d[f"layer_{i}"] for i in range(n)]
    rest = {k: v for k, v in d.items() if not re.fullmatch(r"layer_\d+", k)}
    return {**rest, "layers": jax.tree.map(lambda *xs: np.stack(xs) if isinstance(xs[0], np.ndarray)
                                           else jnp.stack(xs), *layers)}
  return _map_layer_dicts(params, stack)


def unscan_params(params):
  """Scanned -> unscanned layout (inverse of `scan_params`)."""
  def split(d):
    if "layers" not in d:
      return d
    n = jax.tree.leaves(d["layers"])[0].shape[0]
    rest = {k: v for k, v in d.items() if k != "layers"}
    return {**rest, **{f"layer_{i}": jax.tree.map(lambda x: x[i], d["layers"]) for i in range(n)}}
  return _map_layer_dicts(params, split)

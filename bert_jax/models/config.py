"""`BertConfig`: the encoder's hyperparameters, its paper presets and its Hugging Face config.json forms (each
family's keys: `hf_keys`, `modernbert_keys`).

  cfg = BertConfig.from_preset("base", dtype=jnp.bfloat16)
  cfg = BertConfig.from_hf_dict(json.load(open("config.json")))
"""

import dataclasses
import re
from typing import Any

import jax
import jax.numpy as jnp

from bert_jax.models import dropout
from bert_jax.models import fsdp_gather
from bert_jax.models import hf_keys
from bert_jax.models import modernbert_keys

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

HF_MODEL_TYPES = ("bert", "albert", "roberta", "distilbert", "electra", "modernbert")


SHARED_SUBLAYERS = ("", "attention", "ffn")
ATTENTION_KERNELS = ("xla", "splash", "splash_interpret", "flash", "flash_interpret")
# Where the "flash" kernel's dropout bits come from on TPU (models/flash_dropout.py).
FLASH_BITS = ("hash", "hardware")
# What the explicit attention path keeps for its backward pass in training (models/softmax_dropout.py):
# "float32", "bfloat16" or "compute" (the model's `dtype`) probabilities and the dropout mask, or
# "autodiff": whatever autodiff saves.
ATTENTION_RESIDUALS = ("float32", "bfloat16", "compute", "autodiff")
# The dtype the explicit path's scores q k^T are written in: "float32", or "compute" (the model's `dtype`, as
# its other matmuls write theirs); the softmax is computed in float32 either way.
ATTENTION_SCORES = ("float32", "compute")
LAYER_NORM_KERNELS = ("xla", "pallas", "interpret")
# How the projections' and the tied decoder's matmuls are written (models/library_matmul.py): "xla" (einsums and
# autodiff's backward pass, laid out by XLA: every TPU step) or "library" (each product, forward and backward,
# in the form XLA:CPU hands to its matrix library, bfloat16 products on a CPU's AMX units).
MATMULS = ("xla", "library")
# The fields that choose how the model computes, not what: a checkpoint's config gives the architecture and
# the run's config these (`finetune.init.load_encoder`), with its dtype and dropout rates.
COMPUTE_FIELDS = ("remat_policy", "reshard_after_forward", "constrain_attention_matrices", "fused_qkv",
                  "recompute_gelu", "embedding_lookup_on_shards", "decoder_on_shards", "attention_kernel", "flash_bits",
                  "dropout_bits", "attention_residuals", "attention_scores", "layer_norm_kernel",
                  "matmuls", "scan_unroll")


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
  hidden_act: str = "gelu"  # exact erf GELU (Hugging Face's BERT); "gelu_new": tanh (google-research/bert's)
  hidden_dropout: float = 0.1
  attention_dropout: float = 0.1
  initializer_range: float = 0.02
  layer_norm_eps: float = 1e-12
  dtype: Any = jnp.float32        # compute
  param_dtype: Any = jnp.float32  # storage
  scan_layers: bool = False       # one compiled layer body under nn.scan; params get a "layers" axis
  # With scan_layers: the layers each trip of the scan's loop runs (`jax.lax.scan`'s unroll); num_layers: no
  # loop, every layer unrolled over the stacked params (docs/performance.md, "Unrolled over stacked parameters").
  scan_unroll: int = 1
  remat_policy: str = "none"      # "none" or a key of REMAT_POLICIES
  # False: each fsdp-sharded projection kernel is all-gathered once a step, its forward copy kept for the
  # backward pass (PyTorch FSDP's reshard_after_forward=False; `fsdp_gather.py`; not the embedding tables;
  # in looped layers only the attention projections', `projections.dense`).
  # True: XLA gathers it where it is used (on TPU v3, in each pass).
  reshard_after_forward: bool = True
  # With reshard_after_forward True: the attention projections' [H, N * K] matrices (`projections.Einsum`)
  # constrained to their kernel's sharding where they are made, so that XLA gathers and reduce-scatters the
  # matrix, not the 3-D kernel (BERT-large phase 1 on v5e:8x8 moves fewer bytes); False leaves where to
  # reshape to XLA (phase 2 there moves fewer without it; docs/performance.md).
  constrain_attention_matrices: bool = True
  # True: queries, keys and values from one matmul with the three kernels stacked (`projections.fused_qkv`;
  # the same parameters and products); False: three.
  fused_qkv: bool = False
  # True: the feed-forward GELU recomputed in the backward pass of unrolled layers too, as looped layers
  # always do (`encoder.scan_recomputed`); False: autodiff's, fused by XLA.
  recompute_gelu: bool = False
  # True: the word-embedding lookup on each device's shard of the table (`embedding_lookup.py`: an
  # all-to-all, no table-sized gradient), where the layout allows; False: jnp.take, laid out by XLA.
  embedding_lookup_on_shards: bool = False
  # True: the pretraining MLM head's decoder (tied to the word embeddings) and its cross-entropy on each
  # device's slice of the vocabulary (`vocab_split.py`: no gathered table, no logits leave the devices),
  # where the layout allows and the masked positions' labels are given (`heads.BertForPreTraining`: the bert,
  # roberta, albert and modernbert objectives; the other objectives' heads take the logits); False:
  # `tied_logits` on the table, laid out by XLA.
  decoder_on_shards: bool = False
  # ALBERT: embeddings (and their LayerNorm) of this width, projected to hidden_size; the MLM head maps back
  # to it. None: no projection (BERT). Set equal to hidden_size, the projection is still there (as in ALBERT).
  embedding_size: int | None = None
  share_layers: bool = False      # ALBERT: every layer applies one parameter set (`shared_layer`)
  # ALBERT's Table 4: one sublayer shared across layers, the rest per layer (LayerNorms too): "attention"
  # (`shared_attention`) or "ffn" (`shared_intermediate`, `shared_output`); "": none.
  shared_sublayer: str = ""
  causal: bool = False            # query i attends to keys <= i only (a left-to-right LM)
  # RoBERTa: default position ids count real tokens from position_pad_id + 1; padding (this id in input_ids)
  # gets position_pad_id (HF `create_position_ids_from_input_ids`). None: positions 0..L-1 (BERT).
  position_pad_id: int | None = None
  # ModernBERT's switches (Warner et al. 2024, 2.1.1), each acting on its own.
  rope_theta: float | None = None        # rotary positions of this base, no position table; None: learned table
  local_rope_theta: float | None = None  # RoPE base of the sliding-window layers; None: rope_theta
  geglu: bool = False        # feed-forward gelu(x W_in) * (x W_gate): `intermediate` projects to 2 * intermediate
  pre_norm: bool = False     # LayerNorm before each sublayer; layer 0 attends to the embedding norm's output as is
  final_norm: bool = False   # a LayerNorm (`final_layer_norm`) after the last layer
  norm_bias: bool = True     # LayerNorms with a bias
  dense_bias: bool = True    # attention, feed-forward and MLM-transform projections with a bias
  # Layer i attends globally when i % global_attn_every_n_layers == 0; the others to the keys within
  # local_attention // 2 positions on either side (Hugging Face's window of local_attention tokens).
  global_attn_every_n_layers: int = 1
  local_attention: int | None = None
  # Heads removed from the weights (Michel et al. 2019; `pruning.prune_heads`): ((layer, (head, ...)), ...), in
  # the original head numbering, as transformers' `pruned_heads`. Layer i keeps `layer_num_heads(i)` heads.
  pruned_heads: tuple = ()
  # How the fused attention runs (`models/splash.py`): "xla" (jax.nn.dot_product_attention with a dense mask,
  # any backend), "splash" (Pallas' block-sparse TPU kernel: segment ids and windows, no [B, N, L, L] scores)
  # or "splash_interpret" (that kernel interpreted, on any backend: tests); attention dropout takes the
  # explicit path with these. "flash" (`models/flash_dropout.py`): a Pallas TPU kernel with BERT's attention
  # dropout inside, segment ids only ("flash_interpret": interpreted). Attention probabilities
  # (`output_attentions`) always take the explicit path.
  attention_kernel: str = "xla"
  # The "flash" kernel's dropout bits on TPU (FLASH_BITS): "hash" (a counter hash, the same bits on every
  # backend) or "hardware" (the TPU's generator inside the kernel: fewer vector ops; other backends hash).
  flash_bits: str = "hash"
  # Every other dropout's bits (models/dropout.py, DROPOUT_BITS): "threefry" (`random.bernoulli` with the
  # dropout key's generator, `dropout_rng`) or "hash" (a counter hash per element, as the flash kernel's;
  # the same bits on every mesh; cheaper on a CPU).
  dropout_bits: str = "threefry"
  # With attention dropout, what the backward pass keeps of the [B, N, L, L] probabilities (ATTENTION_RESIDUALS;
  # models/softmax_dropout.py): "float32" (autodiff's gradients, 5 bytes an element instead of 7), "bfloat16"
  # (3 bytes; the softmax's backward pass from rounded probabilities), "compute" (`dtype`'s: bfloat16 in
  # bfloat16 compute, float32 in float32) or "autodiff" (the plain ops, which a remat policy other than
  # "none" also takes).
  attention_residuals: str = "float32"
  # The dtype the explicit path writes its [B, N, L, L] scores q k^T in (ATTENTION_SCORES): "float32", or
  # "compute": `dtype`, as the layer's other matmuls and mixed-precision BERTs elsewhere (PyTorch's autocast,
  # Megatron-LM's fused softmax, which takes half-precision scores) write theirs. The softmax runs in float32
  # on them either way; with bfloat16 compute, "compute" rounds each score to 8 significant bits and halves
  # what the scores move (models/softmax_dropout.py).
  attention_scores: str = "float32"
  # LayerNorm's backward pass (LAYER_NORM_KERNELS; models/layer_norm_kernel.py): "xla" (two fusions), "pallas"
  # (one Pallas kernel on TPU, XLA's ops elsewhere) or "interpret" (the kernel interpreted, any backend: tests).
  layer_norm_kernel: str = "xla"
  # The projections' and the tied decoder's matmuls (MATMULS; models/library_matmul.py): "xla" or "library"
  # (the forms XLA:CPU runs on its matrix library: a CPU's; no TPU step takes it).
  matmuls: str = "xla"

  @property
  def library_matmuls(self) -> bool:
    """Whether the projections, the attention and the tied decoder take XLA:CPU's library forms
    (`matmuls` "library"; models/library_matmul.py)."""
    return self.matmuls == "library"

  def __post_init__(self):
    # Accept dtype names ("bfloat16") as they come from ConfigDicts and command lines.
    object.__setattr__(self, "dtype", jnp.dtype(self.dtype))
    object.__setattr__(self, "param_dtype", jnp.dtype(self.param_dtype))
    if self.hidden_size % self.num_heads:
      raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of num_heads {self.num_heads}")
    if self.hidden_act not in hf_keys.GELU_APPROXIMATE:
      raise ValueError(f"hidden_act {self.hidden_act!r} not supported; "
                       f"one of {sorted(hf_keys.GELU_APPROXIMATE)}")
    if self.remat_policy != "none" and self.remat_policy not in REMAT_POLICIES:
      raise ValueError(f"remat_policy {self.remat_policy!r}; one of {['none', *REMAT_POLICIES]}")
    if (self.global_attn_every_n_layers > 1) != (self.local_attention is not None):
      raise ValueError(f"global_attn_every_n_layers {self.global_attn_every_n_layers} > 1 and local_attention "
                       f"{self.local_attention} go together: set both or neither")
    if self.local_rope_theta is not None and (self.rope_theta is None or self.local_attention is None):
      raise ValueError("local_rope_theta needs rope_theta and sliding-window layers (local_attention)")
    if self.attention_kernel not in ATTENTION_KERNELS:
      raise ValueError(f"attention_kernel {self.attention_kernel!r}; one of {ATTENTION_KERNELS}")
    if self.attention_kernel.startswith("flash") and (self.local_attention is not None or self.causal):
      raise ValueError(f"attention_kernel {self.attention_kernel!r} takes segment ids only: sliding windows "
                       "and causal masks are the 'splash' kernel's")
    if self.layer_norm_kernel not in LAYER_NORM_KERNELS:
      raise ValueError(f"layer_norm_kernel {self.layer_norm_kernel!r}; one of {LAYER_NORM_KERNELS}")
    if self.matmuls not in MATMULS:
      raise ValueError(f"matmuls {self.matmuls!r}; one of {MATMULS}")
    if self.flash_bits not in FLASH_BITS:
      raise ValueError(f"flash_bits {self.flash_bits!r}; one of {FLASH_BITS}")
    if self.dropout_bits not in dropout.DROPOUT_BITS:
      raise ValueError(f"dropout_bits {self.dropout_bits!r}; one of {dropout.DROPOUT_BITS}")
    if self.attention_residuals not in ATTENTION_RESIDUALS:
      raise ValueError(f"attention_residuals {self.attention_residuals!r}; one of {ATTENTION_RESIDUALS}")
    if self.attention_scores not in ATTENTION_SCORES:
      raise ValueError(f"attention_scores {self.attention_scores!r}; one of {ATTENTION_SCORES}")
    if self.scan_unroll < 1:
      raise ValueError(f"scan_unroll {self.scan_unroll}: the layers a trip of the scanned loop runs, 1 or more")
    if self.shared_sublayer not in SHARED_SUBLAYERS:
      raise ValueError(f"shared_sublayer {self.shared_sublayer!r}; one of {SHARED_SUBLAYERS}")
    if self.shared_sublayer and (self.share_layers or self.scan_layers):
      raise ValueError(f"shared_sublayer {self.shared_sublayer!r} goes with neither share_layers (which shares "
                       "every sublayer) nor scan_layers")
    if self.pre_norm and self.share_layers:
      raise ValueError("pre_norm with share_layers is not supported (layer 0 has no attention norm)")
    object.__setattr__(self, "pruned_heads", _pruned_heads(self.pruned_heads, self.num_layers, self.num_heads))
    if self.pruned_heads and (self.share_layers or self.scan_layers or self.shared_sublayer == "attention"):
      raise ValueError("pruned_heads need per-layer attention weights: not with share_layers, scan_layers or "
                       "shared_sublayer 'attention'")

  @property
  def looped_layers(self) -> bool:
    """Whether the layers run in a loop (scanned, fewer than all of them a trip, or one a trip: `jax.lax.scan`
    keeps a loop of one trip for a single layer): what each layer saves for the backward pass is then stacked
    into arrays of all layers."""
    return self.scan_layers and (self.scan_unroll == 1 or self.scan_unroll < self.num_layers)

  def layer_num_heads(self, layer: int) -> int:
    """Heads of layer `layer` after `pruned_heads`."""
    return self.num_heads - len(dict(self.pruned_heads).get(layer, ()))

  def kept_heads(self, layer: int) -> tuple:
    """The original numbers of the heads layer `layer` keeps, in weight order."""
    removed = set(dict(self.pruned_heads).get(layer, ()))
    return tuple(h for h in range(self.num_heads) if h not in removed)

  @property
  def remat_checkpoint_policy(self):
    """`remat_policy`'s jax.checkpoint policy; without resharding after the forward pass, it also keeps the
    gathered weights (`fsdp_gather.GATHERED`) instead of gathering them again in the recomputation."""
    policy = REMAT_POLICIES[self.remat_policy]
    if self.reshard_after_forward:
      return policy
    return jax.checkpoint_policies.save_from_both_policies(
        policy, jax.checkpoint_policies.save_only_these_names(fsdp_gather.GATHERED))

  def _named_dtype(self, name: str):
    """The dtype a compute field names: "compute" is the model's `dtype`, any other name is its own."""
    return self.dtype if name == "compute" else jnp.dtype(name)

  @property
  def residuals_dtype(self):
    """What `attention_residuals` keeps the probabilities in (not "autodiff")."""
    return self._named_dtype(self.attention_residuals)

  @property
  def scores_dtype(self):
    """What `attention_scores` names: the dtype of the explicit path's scores."""
    return self._named_dtype(self.attention_scores)

  @property
  def head_dim(self) -> int:
    """Size of one attention head (hidden_size // num_heads)."""
    return self.hidden_size // self.num_heads

  @property
  def embedding_dim(self) -> int:
    """Width of the embedding tables and of the MLM head's transform: embedding_size or hidden_size."""
    return self.hidden_size if self.embedding_size is None else self.embedding_size

  @property
  def max_input_length(self) -> int:
    """The longest input the position table holds: RoBERTa's positions start after its pad id."""
    offset = 0 if self.position_pad_id is None else self.position_pad_id + 1
    return self.max_position_embeddings - offset

  @property
  def split_axis_sizes(self) -> dict[str, tuple[int, ...]]:
    """The parameters' sizes along the logical axes a mesh may split (`config.logical_axis_rules`): each
    layer's heads, the feed-forward width, the vocabulary and the widths of `embed`. The mesh axes a rule
    puts one on must divide them all (`sharding.uneven_axes`)."""
    heads = sorted({self.layer_num_heads(i) for i in range(self.num_layers)} - {0})
    return {"heads": tuple(heads), "mlp": (self.intermediate_size,), "vocab": (self.vocab_size,),
            "embed": tuple(sorted({self.hidden_size, self.embedding_dim}))}

  @property
  def model_type(self) -> str:
    """The Hugging Face family this config is written as (config.json `model_type`, tensor names)."""
    if (self.rope_theta is not None or self.geglu or self.pre_norm or self.final_norm or not self.norm_bias
        or not self.dense_bias or self.local_attention is not None):
      return "modernbert"
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
    """From a Hugging Face config.json (model_type bert, albert, roberta, distilbert, electra or modernbert;
    none: a Google bert_config.json).

    Unknown keys are ignored; a family or variant this encoder does not implement is a ValueError. An
    ELECTRA config reads as BERT (or, with an embedding size other than the hidden size, as ALBERT's
    projection): its tensor names are the caller's to know (`checkpoints_hf.load_hf` reads config.json).
    """
    if d.get("pruned_heads"):  # every family's key (transformers' PretrainedConfig)
      overrides = {"pruned_heads": d["pruned_heads"], **overrides}
    if d.get("position_embedding_type", "absolute") != "absolute":
      raise ValueError(f"position_embedding_type {d['position_embedding_type']!r} is not supported")
    model_type = d.get("model_type", "bert")
    if model_type not in HF_MODEL_TYPES:
      raise ValueError(f"model_type {model_type!r} is not supported; one of {list(HF_MODEL_TYPES)}")
    if model_type == "modernbert":
      return cls(**{**modernbert_keys.fields(d), **overrides})
    return cls(**{**hf_keys.fields(d, model_type), **overrides})

  def to_hf_dict(self) -> dict:
    """A config.json of `model_type` (BertConfig, AlbertConfig, RobertaConfig, DistilBertConfig or
    ModernBertConfig in transformers; ELECTRA's is `checkpoints_hf.electra_hf_dict`)."""
    d = self._family_hf_dict()
    if self.pruned_heads:  # transformers prunes these heads when it builds the model, then loads the weights
      d["pruned_heads"] = {str(layer): list(heads) for layer, heads in self.pruned_heads}
    return d

  def _family_hf_dict(self) -> dict:
    if self.model_type == "modernbert":
      return modernbert_keys.hf_dict(self)
    return hf_keys.hf_dict(self)


def _pruned_heads(pruned, num_layers: int, num_heads: int) -> tuple:
  """`pruned_heads` as ((layer, (head, ...)), ...), sorted, from that form, a dict or JSON lists; checked."""
  items = pruned.items() if isinstance(pruned, dict) else pruned
  out = {}
  for layer, heads in items:
    layer, heads = int(layer), tuple(sorted({int(h) for h in heads}))
    if not 0 <= layer < num_layers or any(not 0 <= h < num_heads for h in heads):
      raise ValueError(f"pruned_heads: layer {layer} heads {heads} outside {num_layers} layers x {num_heads} heads")
    if heads:
      out[layer] = tuple(sorted(set(out.get(layer, ())) | set(heads)))
  return tuple(sorted(out.items()))

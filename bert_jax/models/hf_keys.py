"""Hugging Face `BertConfig`, `AlbertConfig`, `RobertaConfig`, `DistilBertConfig` and `ElectraConfig` <->
`BertConfig` fields (ModernBERT's keys are `modernbert_keys`'); `BertConfig.from_hf_dict` and `to_hf_dict`
call these for the families they name.
"""

# BertConfig field <-> Hugging Face config.json key.
_HF_KEYS = {
    "vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads", "intermediate_size": "intermediate_size",
    "max_position_embeddings": "max_position_embeddings", "type_vocab_size": "type_vocab_size",
    "hidden_dropout": "hidden_dropout_prob", "attention_dropout": "attention_probs_dropout_prob",
    "initializer_range": "initializer_range", "layer_norm_eps": "layer_norm_eps",
    "hidden_act": "hidden_act",
}
# hidden_act -> whether its GELU is the tanh approximation ("gelu": exact, erf).
GELU_APPROXIMATE = {"gelu": False, "gelu_new": True, "gelu_pytorch_tanh": True}
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


def fields(d: dict, model_type: str) -> dict:
  """BertConfig fields of a config.json dict of `model_type` (bert, albert, roberta, distilbert or electra)."""
  if model_type == "distilbert":
    return _distilbert_fields(d)
  if model_type == "electra":
    d = {**_ELECTRA_DEFAULTS, **d}
  fields = {f: d[k] for f, k in _HF_KEYS.items() if k in d}
  fields["causal"] = bool(d.get("is_decoder", False))
  if d.get("shared_sublayer"):
    fields["shared_sublayer"] = d["shared_sublayer"]
  if model_type == "albert":
    fields.update(_albert_fields(d))
  elif model_type == "roberta":
    fields["position_pad_id"] = d.get("pad_token_id", 1)  # transformers' RobertaConfig default
  elif model_type == "electra":  # the projection exists only when the widths differ (ElectraEmbeddings)
    fields["embedding_size"] = None if d["embedding_size"] == d["hidden_size"] else d["embedding_size"]
  return fields


def hf_dict(cfg) -> dict:
  """A config.json dict of the BertConfig `cfg` as its `model_type` (bert, albert, roberta or distilbert)."""
  if cfg.model_type == "distilbert":
    return _distilbert_hf_dict(cfg)
  d = {k: getattr(cfg, f) for f, k in _HF_KEYS.items()}
  if cfg.shared_sublayer:   # no Hugging Face family has it: only our run records carry this key
    d["shared_sublayer"] = cfg.shared_sublayer
  d.update(model_type="bert", architectures=["BertForPreTraining"], pad_token_id=0,
           position_embedding_type="absolute")
  if cfg.causal:
    d["is_decoder"] = True  # BertModel and RobertaModel mask causally then
  if cfg.model_type == "albert":
    if cfg.position_pad_id is not None:
      raise ValueError("no Hugging Face family has both ALBERT's embeddings or sharing and RoBERTa's positions")
    d.update(model_type="albert", architectures=["AlbertForPreTraining"], embedding_size=cfg.embedding_size,
             num_hidden_groups=1 if cfg.share_layers else cfg.num_layers, inner_group_num=1)
    if cfg.num_layers == 1:   # one group either way: our own key says which params the layer has
      d["share_layers"] = cfg.share_layers
  elif cfg.model_type == "roberta":
    d.update(model_type="roberta", architectures=["RobertaForMaskedLM"], pad_token_id=cfg.position_pad_id)
  return d


def _distilbert_hf_dict(cfg) -> dict:
  """A DistilBertConfig dict: no token types, learned positions, LayerNorm eps 1e-12, bidirectional."""
  if cfg.causal or cfg.layer_norm_eps != 1e-12:
    raise ValueError(f"transformers' DistilBERT (type_vocab_size 0) has no causal mask and LayerNorm eps 1e-12; "
                     f"got causal={cfg.causal}, layer_norm_eps={cfg.layer_norm_eps}")
  d = {k: getattr(cfg, f) for k, f in _DISTILBERT_KEYS.items()}
  d.update(model_type="distilbert", architectures=["DistilBertForMaskedLM"], pad_token_id=0,
           sinusoidal_pos_embds=False)
  return d


def _distilbert_fields(d: dict) -> dict:
  """BertConfig fields of a DistilBertConfig dict; sinusoidal positions and activations other than GELU are
  errors."""
  if d.get("sinusoidal_pos_embds", False):
    raise ValueError("DistilBERT with sinusoidal_pos_embds is not supported: only learned position embeddings")
  d = {**_DISTILBERT_DEFAULTS, **d}
  if d["activation"] not in GELU_APPROXIMATE:
    raise ValueError(f"DistilBERT activation {d['activation']!r} is not supported; one of {sorted(GELU_APPROXIMATE)}")
  return {**{f: d[k] for k, f in _DISTILBERT_KEYS.items()}, "type_vocab_size": 0}


def _albert_fields(d: dict) -> dict:
  """BertConfig fields of an AlbertConfig dict: one group shared by all layers, or one group per layer."""
  layers, groups = d.get("num_hidden_layers", 12), d.get("num_hidden_groups", 1)
  if d.get("inner_group_num", 1) != 1 or groups not in (1, layers):
    raise ValueError(f"ALBERT with num_hidden_groups {groups} and inner_group_num {d.get('inner_group_num')} is "
                     "not supported: only one layer per group, in one group or one group per layer")
  # transformers' AlbertConfig defaults where a key is absent.
  return {"embedding_size": d.get("embedding_size", 128), "share_layers": d.get("share_layers", groups == 1),
          "hidden_act": d.get("hidden_act", "gelu_new")}

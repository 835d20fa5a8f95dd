"""Hugging Face `ModernBertConfig` (Warner et al. 2024) <-> `BertConfig` fields.

ModernBERT is the encoder with all of its modern switches on: RoPE (separate bases for global and
sliding-window layers), GeGLU feed-forward, pre-norm layers with an embedding norm and a final norm,
LayerNorms and linear layers without biases, a global layer every N layers and sliding-window attention in
the others, no token types and no position table. Its dropouts map to ours as: `mlp_dropout` (and
`embedding_dropout`, which must equal it) -> hidden_dropout, `attention_dropout` -> attention_dropout.
"""

# transformers' ModernBertConfig defaults (ModernBERT-base) where a key is absent.
DEFAULTS = {"vocab_size": 50368, "hidden_size": 768, "intermediate_size": 1152, "num_hidden_layers": 22,
            "num_attention_heads": 12, "hidden_activation": "gelu", "max_position_embeddings": 8192,
            "initializer_range": 0.02, "norm_eps": 1e-5, "norm_bias": False, "global_rope_theta": 160000.0,
            "attention_bias": False, "attention_dropout": 0.0, "global_attn_every_n_layers": 3,
            "local_attention": 128, "local_rope_theta": 10000.0, "embedding_dropout": 0.0, "mlp_bias": False,
            "mlp_dropout": 0.0, "decoder_bias": True, "classifier_bias": False, "classifier_activation": "gelu"}
# ModernBertConfig key -> BertConfig field, read as they are.
_KEYS = {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "intermediate_size": "intermediate_size",
         "num_hidden_layers": "num_layers", "num_attention_heads": "num_heads",
         "hidden_activation": "hidden_act", "max_position_embeddings": "max_position_embeddings",
         "initializer_range": "initializer_range", "norm_eps": "layer_norm_eps", "norm_bias": "norm_bias",
         "attention_bias": "dense_bias", "mlp_dropout": "hidden_dropout", "attention_dropout": "attention_dropout",
         "global_attn_every_n_layers": "global_attn_every_n_layers",
         "global_rope_theta": "rope_theta", "local_rope_theta": "local_rope_theta"}
# The switches every ModernBERT has on (and BERT's that it has off).
SWITCHES = {"geglu": True, "pre_norm": True, "final_norm": True, "type_vocab_size": 0, "embedding_size": None,
            "share_layers": False, "causal": False, "position_pad_id": None}


def fields(d: dict) -> dict:
  """BertConfig fields of a ModernBertConfig dict; what our encoder cannot express is a ValueError."""
  d = {**DEFAULTS, **d}
  rope = d.get("rope_parameters")   # newer transformers: {"full_attention": {"rope_theta": ...}, ...}
  if isinstance(rope, dict) and "full_attention" in rope:
    d["global_rope_theta"] = rope["full_attention"]["rope_theta"]
    d["local_rope_theta"] = (rope.get("sliding_attention") or rope["full_attention"])["rope_theta"]
  problems = []
  if not d["attention_bias"] == d["mlp_bias"] == d["classifier_bias"]:
    problems.append("attention_bias, mlp_bias and classifier_bias differ (one switch here: dense_bias)")
  if not d["decoder_bias"]:
    problems.append("decoder_bias false (the MLM decoder always has a bias here)")
  if d["classifier_activation"] != d["hidden_activation"]:
    problems.append("classifier_activation differs from hidden_activation")
  every = d["global_attn_every_n_layers"]
  kinds = ["full_attention" if i % every == 0 else "sliding_attention" for i in range(d["num_hidden_layers"])]
  if d.get("layer_types") not in (None, kinds):   # newer transformers write them out
    problems.append(f"layer_types {d['layer_types']} (only a global layer every global_attn_every_n_layers)")
  if d["embedding_dropout"] != d["mlp_dropout"]:
    problems.append("embedding_dropout differs from mlp_dropout (one hidden_dropout here)")
  if problems:
    raise ValueError("ModernBERT config not supported: " + "; ".join(problems))
  out = {f: d[k] for k, f in _KEYS.items()}
  global_only = d["global_attn_every_n_layers"] == 1
  out["local_attention"] = None if global_only else d["local_attention"]
  out["local_rope_theta"] = None if global_only else d["local_rope_theta"]
  return {**out, **SWITCHES}


def hf_dict(cfg) -> dict:
  """A ModernBertConfig dict of the BertConfig `cfg`; a config ModernBERT cannot express is a ValueError."""
  differ = [f"{f}={getattr(cfg, f)!r}" for f, v in SWITCHES.items() if getattr(cfg, f) != v]
  if cfg.rope_theta is None:
    differ.append("rope_theta=None (ModernBERT has no position table)")
  if differ:
    raise ValueError(f"transformers' ModernBERT cannot express this config: {', '.join(differ)}")
  d = {k: getattr(cfg, f) for k, f in _KEYS.items()}
  d.update(mlp_bias=cfg.dense_bias, classifier_bias=cfg.dense_bias, decoder_bias=True,
           classifier_activation=cfg.hidden_act, embedding_dropout=cfg.hidden_dropout,
           local_attention=cfg.local_attention or DEFAULTS["local_attention"],
           local_rope_theta=cfg.local_rope_theta or cfg.rope_theta,
           model_type="modernbert", architectures=["ModernBertForMaskedLM"])
  # ModernBERT's tokenizer ids where the vocabulary holds them; else 0..3 (the reference checkpoints').
  big = cfg.vocab_size > 50284
  d.update(pad_token_id=50283 if big else 0, bos_token_id=50281 if big else 1, cls_token_id=50281 if big else 1,
           eos_token_id=50282 if big else 2, sep_token_id=50282 if big else 2)
  return d

"""Initial encoder and tokenizer for finetuning, from `config.init_checkpoint`.

The checkpoint may be a Hugging Face directory (config.json + weights), a Google TF checkpoint (a
`*.ckpt` prefix or a directory holding one), a bert_jax pretraining checkpoint, or the `best/` of a
finetuned workdir (two-stage finetuning: only its encoder is kept).

    bert_cfg, encoder_params = load_encoder(config)   # params None without init_checkpoint
    tokenizer = load_tokenizer(config)
"""

import dataclasses
import json
import os

import ml_collections

from bert_jax import checkpointing
from bert_jax import model as model_lib
from bert_jax import tokenizer as tokenizer_lib
from bert_jax import train

Config = ml_collections.ConfigDict


def detect_format(path: str) -> str:
  """"hf" (config.json + weights), "tf" (a `*.ckpt` prefix or a directory holding one) or "bert_jax"."""
  if os.path.isfile(os.path.join(path, "config.json")) and not os.path.isfile(os.path.join(path, "bert_config.json")):
    return "hf"
  if os.path.isfile(path + ".index") or (os.path.isdir(path) and any(f.endswith(".ckpt.index")
                                                                      for f in os.listdir(path))):
    return "tf"
  return "bert_jax"


def _bert_jax_config(config: Config, path: str) -> model_lib.BertConfig:
  candidates = [config.bert_config_json] + [os.path.join(d, "bert_config.json")
                                            for d in (path, os.path.dirname(path.rstrip("/")))]
  for c in candidates:
    if c and os.path.isfile(c):
      with open(c) as f:
        return model_lib.BertConfig.from_hf_dict(json.load(f))
  return train.bert_config(config)


def load_encoder(config: Config) -> tuple[model_lib.BertConfig, dict | None]:
  """(BertConfig, encoder params as host arrays, or None without `init_checkpoint`)."""
  path = config.init_checkpoint
  if not path:
    cfg, params = train.bert_config(config), None  # `config.model`: a preset and the fields set
  else:
    fmt = detect_format(path) if config.init_checkpoint_format == "auto" else config.init_checkpoint_format
    if fmt == "hf":
      from bert_jax import checkpoints_hf  # pylint: disable=g-import-not-at-top
      cfg, params = checkpoints_hf.load_hf(path)
    elif fmt == "tf":
      from bert_jax import checkpoints_tf  # pylint: disable=g-import-not-at-top
      cfg, params = checkpoints_tf.load_tf(path, config.bert_config_json or None)
    elif fmt in ("bert_jax", "finetuned"):
      # A finetuned workdir's `best/` holds {"params": {"bert", <head>}}: only the encoder is kept.
      cfg, params = _bert_jax_config(config, path), checkpointing.restore_params(path)
    else:
      raise ValueError(f"init_checkpoint_format {fmt!r}: use auto, hf, tf, bert_jax or finetuned")
    params = params.get("bert", params)
    # Either layout in, the configured layout out (both functions leave the other layout unchanged).
    params = model_lib.scan_params(params) if config.scan_layers else model_lib.unscan_params(params)
  dropout = {k: config.model[k] for k in ("hidden_dropout", "attention_dropout") if config.model.get(k) is not None}
  cfg = dataclasses.replace(cfg, dtype=config.dtype, scan_layers=config.scan_layers, **dropout)
  return cfg, params


def load_tokenizer(config: Config):
  path = config.vocab_file or config.init_checkpoint
  if not path:
    raise ValueError("set config.vocab_file (or init_checkpoint, whose directory holds the vocabulary)")
  if not config.vocab_file and detect_format(path) == "tf" and not os.path.isdir(path):
    path = os.path.dirname(path)
  if os.path.isdir(path) and not any(f == "vocab.txt" or f.endswith(".model") for f in os.listdir(path)):
    path = os.path.dirname(path.rstrip("/"))  # a finetuned `best/`: the tokenizer is in its workdir
  return tokenizer_lib.load_tokenizer(path, config.do_lower_case)

"""Initial encoder and tokenizer for finetuning, from `config.init_checkpoint`.

The checkpoint is any that `checkpoint_loader` reads: a Hugging Face directory, a Google TF checkpoint, a
bert_jax pretraining run, or a finetuned workdir / its `best/` (two-stage finetuning: only its encoder is
kept).

    bert_cfg, encoder_params = load_encoder(config)   # params None without init_checkpoint
    tokenizer = load_tokenizer(config)
    pooling = classifier_pooling(config, bert_cfg)    # how a sequence classifier reads the encoder
"""

import dataclasses
import json
import os

import ml_collections

from bert_jax import checkpoint_loader
from bert_jax import failures
from bert_jax.models import encoder as model_lib
from bert_jax.models import heads
from bert_jax.models.config import COMPUTE_FIELDS
from bert_jax import train

Config = ml_collections.ConfigDict
# `init_checkpoint_format` -> checkpoint_loader's kind: a finetuned checkpoint is an orbax one like pretraining's.
_KINDS = {"auto": "auto", "hf": "hf", "tf": "tf", "bert_jax": "bert_jax", "finetuned": "bert_jax"}


def detect_format(path: str) -> str:
  """The kind `init_checkpoint_format: auto` finds: "hf", "tf" or "bert_jax" (checkpoint_loader.find)."""
  return checkpoint_loader.find(path).kind


def load_encoder(config: Config) -> tuple[model_lib.BertConfig, dict | None]:
  """(BertConfig, encoder params as host arrays, or None without `init_checkpoint`)."""
  if not config.init_checkpoint:  # `config.model`: a preset and the fields set
    return dataclasses.replace(train.bert_config(config), scan_layers=config.scan_layers), None
  if config.init_checkpoint_format not in _KINDS:
    raise failures.UserError(f"init_checkpoint_format {config.init_checkpoint_format!r}: one of "
                             f"{', '.join(_KINDS)}")
  # The checkpoint gives the architecture; `config.model` its dropout rates and how it computes.
  overrides = {k: config.model[k] for k in ("hidden_dropout", "attention_dropout", *COMPUTE_FIELDS)
               if config.model.get(k) is not None}
  cfg, params = checkpoint_loader.load_model(
      config.init_checkpoint, kind=_KINDS[config.init_checkpoint_format],
      bert_config_json=config.bert_config_json or None, scan_layers=config.scan_layers, dtype=config.dtype,
      **overrides)
  return cfg, params["bert"]


def load_tokenizer(config: Config):
  """`config.vocab_file`'s tokenizer, else the one beside `init_checkpoint`. `config.do_lower_case` None (the
  default) follows the tokenizer_config.json beside the vocabulary or checkpoint, as Hugging Face's
  `from_pretrained` does (a cased checkpoint says false), else lowercases. A cased tokenization (CoNLL-2003's
  config) of an uncased WordPiece vocabulary, which holds no capital letter, is refused: every capitalised word
  would be [UNK], the named entities first."""
  if config.vocab_file:
    tokenizer = checkpoint_loader.load_vocab(config.vocab_file, config.do_lower_case,
                                             _directory(config.init_checkpoint))
    source = "config.vocab_file"
  elif not config.init_checkpoint:
    raise failures.UserError("set config.vocab_file (or init_checkpoint, whose directory holds the vocabulary)")
  else:
    tokenizer = checkpoint_loader.load_tokenizer(config.init_checkpoint, config.do_lower_case)
    source = "config.init_checkpoint"
  if tokenizer.kind == "wordpiece" and not tokenizer.do_lower_case and _uncased(tokenizer.inv_vocab):
    said = "config.do_lower_case is False" if config.do_lower_case is not None else \
        f"the tokenizer_config.json of {source} says do_lower_case false"
    raise failures.UserError(
        f"{said} but the vocabulary of {source} ({tokenizer.source_file}) is uncased (no "
        "token with a capital letter): every capitalised word would be [UNK]. Finetune a cased checkpoint (the "
        "paper's NER results are BERT cased's), or set --config.do_lower_case=True")
  return tokenizer


def _directory(checkpoint: str) -> str | None:
  """The folder of the checkpoint `init_checkpoint` names; None without one (its own check says what is wrong)."""
  try:
    return checkpoint_loader.find(checkpoint).directory if checkpoint else None
  except (FileNotFoundError, ValueError):
    return None


def _uncased(tokens) -> bool:
  """Whether a WordPiece vocabulary is an uncased one: Latin letters, none of them capital, outside its bracketed
  special tokens (a vocabulary of scripts without case is neither)."""
  words = [t for t in tokens if not (t.startswith("[") and t.endswith("]"))]
  return any(c in "abcdefghijklmnopqrstuvwxyz" for t in words for c in t) and all(t == t.lower() for t in words)


def classifier_pooling(config: Config, bert_cfg: model_lib.BertConfig) -> str:
  """`task_opts.classifier_pooling` ("pooler", "cls", "mean" or "last"; `heads.POOLINGS`), else "last" for a
  causal (left-to-right) model, else a Hugging Face ModernBERT checkpoint's config.json `classifier_pooling`,
  else "cls" for ModernBERT (no pooler; its `head` reads the [CLS] vector, as transformers' default) and BERT's
  "pooler" for the others."""
  pooling = config.task_opts.get("classifier_pooling")
  if pooling:
    if pooling not in heads.POOLINGS:
      raise failures.UserError(f"task_opts.classifier_pooling {pooling!r}: one of {', '.join(heads.POOLINGS)}")
    if bert_cfg.causal and pooling in ("pooler", "cls"):
      raise failures.UserError(
          f"task_opts.classifier_pooling {pooling!r} reads the first token, which a causal (left-to-right) model "
          "computes from itself alone: every input would get the same prediction. Use last (the default for "
          "such a model) or mean")
    return pooling
  if bert_cfg.causal:
    return "last"
  if bert_cfg.model_type != "modernbert":
    return "pooler"
  if config.init_checkpoint:
    hf_config = os.path.join(checkpoint_loader.find(config.init_checkpoint).directory, "config.json")
    if os.path.isfile(hf_config):
      with open(hf_config, encoding="utf-8") as f:
        return json.load(f).get("classifier_pooling", "cls")
  return "cls"

"""Task heads on the BERT encoder: pretraining (MLM + NSP/SOP) and finetuning.

Every model's params are `{"bert": <encoder>, <head>: ...}`, so an encoder moves between models by
copying `params["bert"]`. Logits are float32 whatever the compute dtype.
"""

import flax.linen as nn
import jax.numpy as jnp

from bert_jax.models import dropout
from bert_jax.models import encoder as model
from bert_jax.models import vocab_split
from bert_jax.models.layer_norm import layer_norm
from bert_jax.models.tied_decoder import tied_logits

_OPTIONAL_ENCODER_INPUTS = ("position_ids", "example_ids")


def gather_positions(x_BLH, positions_BP):
  """x[b, positions[b, p]] -> [B, P, H], sharded over the batch as `x` is. Left to the partitioner, with the
  batch over many fsdp shards it gathered the whole batch's [B, P, H] and all-reduced its gradient
  (BERT-large phase 1 on v5e:8x8, 2 x 32 x 1, 4 layers: 3.41 -> 3.18 GB a chip; docs/performance.md)."""
  names = ("activation_batch", None, "activation_embed")
  x_BLH = nn.with_logical_constraint(x_BLH, names)
  positions_BP = nn.with_logical_constraint(positions_BP, names[:2])
  return nn.with_logical_constraint(
      jnp.take_along_axis(x_BLH, positions_BP[..., None].astype(jnp.int32), axis=1), names)


class MaskedLMHead(nn.Module):
  """Transform (dense to the embedding width + GELU + LayerNorm), then the decoder tied to the word
  embeddings, plus a bias. BERT's `cls.predictions`, ALBERT's `predictions` (hidden -> embedding_size),
  RoBERTa's `lm_head`, ModernBERT's `head` and `decoder` (transform and LayerNorm without biases there)."""
  config: model.BertConfig

  @nn.compact
  def __call__(self, x, word_embeddings_VE, labels=None):
    """Logits [..., V] float32; with `labels` [B, P] and `decoder_on_shards`, where its layout applies,
    {"mlm_nll", "mlm_correct"} [B, P] float32 instead (`vocab_split.masked_lm_sums`)."""
    cfg = self.config
    x = model.gelu(cfg, model.dense(cfg, cfg.embedding_dim, ("embed", "mlp"), "transform")(x))
    x = layer_norm(cfg, "layer_norm")(x)
    bias = self.param("output_bias", model.zeros(("vocab",)), (cfg.vocab_size,), cfg.param_dtype)
    if cfg.decoder_on_shards and labels is not None:
      sums = vocab_split.masked_lm_sums(x.astype(cfg.dtype), word_embeddings_VE.astype(cfg.dtype), bias, labels,
                                        cfg.library_matmuls)
      if sums is not None:
        return {"mlm_nll": sums[0], "mlm_correct": sums[1]}
    # Logits in float32: the vocabulary softmax is taken by the loss.
    logits = tied_logits(x.astype(cfg.dtype), word_embeddings_VE.astype(cfg.dtype), bias, cfg.library_matmuls)
    return nn.with_logical_constraint(logits, ("activation_batch", "activation_length", "activation_vocab"))


class BertForPreTraining(nn.Module):
  """MLM (at `masked_lm_positions`, or at all positions) + next-sentence (or sentence-order) head.

  Params: {"bert": ..., "mlm": {"transform", "layer_norm", "output_bias"}, "nsp": {"kernel", "bias"}}.
  """
  config: model.BertConfig
  use_nsp: bool = True
  mlm_all_positions: bool = False
  pool: bool = True   # False: no pooler (an encoder saved without one, e.g. a DistilBERT student)

  @nn.compact
  def __call__(self, batch: dict, *, deterministic: bool = True) -> dict:
    """Returns {"mlm_logits": [B, P, V] (or [B, L, V]), "nsp_logits": [B, 2] or [B, K, 2]} in float32; with
    `decoder_on_shards`, where it applies, "mlm_nll" and "mlm_correct" [B, P] in place of "mlm_logits"."""
    cfg = self.config
    bert = model.BertEncoder(cfg, name="bert")
    nsp_positions = batch.get("next_sentence_positions")
    out = bert(batch["input_ids"], batch["input_mask"], batch["segment_ids"],
               pooled_positions=nsp_positions, deterministic=deterministic, pool=self.pool or self.use_nsp,
               **{k: batch[k] for k in _OPTIONAL_ENCODER_INPUTS if k in batch})
    x = out["sequence_output"]
    if not self.mlm_all_positions:
      # Project only the masked positions to the vocabulary, as google-research/bert does.
      x = gather_positions(x, batch["masked_lm_positions"])
    labels = None if self.mlm_all_positions else batch.get("masked_lm_ids")
    mlm = MaskedLMHead(cfg, name="mlm")(x, bert.word_embeddings(), labels)
    result = dict(mlm) if isinstance(mlm, dict) else {"mlm_logits": mlm}
    if self.use_nsp:
      nsp = model.dense(cfg, 2, ("embed", None), "nsp", use_bias=True)
      result["nsp_logits"] = nsp(out["pooled_output"]).astype(jnp.float32)
    return result


def _encode(cfg, input_ids, input_mask, segment_ids, deterministic, encoder_kwargs, pool=True):
  # Called inside a compact __call__: the encoder becomes the caller's submodule "bert".
  return model.BertEncoder(cfg, name="bert")(input_ids, input_mask, segment_ids,
                                             deterministic=deterministic, pool=pool, **encoder_kwargs)


def _classify(cfg, x, num_labels, deterministic, name="classifier"):
  x = dropout.Dropout(cfg.hidden_dropout, bits=cfg.dropout_bits)(x, deterministic=deterministic)
  return model.dense(cfg, num_labels, ("embed", None), name, use_bias=True)(x).astype(jnp.float32)


class PredictionHead(nn.Module):
  """ModernBERT's `head` before its classifiers: dense + activation + LayerNorm (biases as the encoder's)."""
  config: model.BertConfig

  @nn.compact
  def __call__(self, x):
    cfg = self.config
    x = model.gelu(cfg, model.dense(cfg, cfg.hidden_size, ("embed", "mlp"), "dense")(x))
    return layer_norm(cfg, "norm")(x)


# How a sequence classifier summarises the encoder's output: BERT's pooler (tanh dense on [CLS]), or
# ModernBERT's `classifier_pooling` ("cls": the [CLS] vector, "mean": the mean over real tokens) feeding
# `PredictionHead`; "last": the last real token's vector, the one position a left-to-right (causal) model
# has read the whole input at (OpenAI GPT's classifier), where [CLS] sees only itself.
POOLINGS = ("pooler", "cls", "mean", "last")


def pool_sequence(x_BLH, input_mask_BL, pooling: str):
  """[B, H]: the first position ("cls"), the last real one ("last") or the mean over real tokens ("mean") of
  `x_BLH` (inputs padded on the right)."""
  if pooling == "cls":
    return x_BLH[:, 0]
  if pooling == "last":
    last_B = jnp.maximum(jnp.sum(input_mask_BL > 0, axis=1) - 1, 0)
    return jnp.take_along_axis(x_BLH, last_B[:, None, None], axis=1)[:, 0]
  # Summed in float32: a mean over hundreds of bfloat16 vectors loses digits otherwise.
  mask_BL1 = input_mask_BL[..., None].astype(jnp.float32)
  mean = (x_BLH.astype(jnp.float32) * mask_BL1).sum(1) / jnp.maximum(mask_BL1.sum(1), 1.0)
  return mean.astype(x_BLH.dtype)


class BertForSequenceClassification(nn.Module):
  """Classifier on a summary of the sequence; num_labels == 1 is regression.

  `pooling` "pooler" (BERT): params {"bert" (with its pooler), "classifier"}. "cls" | "mean" (ModernBERT's
  ModernBertForSequenceClassification) | "last" (a causal model's): {"bert" (no pooler), "head", "classifier"}.
  """
  config: model.BertConfig
  num_labels: int
  pooling: str = "pooler"

  @nn.compact
  def __call__(self, input_ids, input_mask, segment_ids, *, deterministic: bool = True, **encoder_kwargs):
    """Returns logits [B, num_labels] float32."""
    if self.pooling not in POOLINGS:
      raise ValueError(f"pooling {self.pooling!r}; one of {POOLINGS}")
    pooler = self.pooling == "pooler"
    out = _encode(self.config, input_ids, input_mask, segment_ids, deterministic, encoder_kwargs, pool=pooler)
    if pooler:
      return _classify(self.config, out["pooled_output"], self.num_labels, deterministic)
    x = pool_sequence(out["sequence_output"], input_mask, self.pooling)
    return _classify(self.config, PredictionHead(self.config, name="head")(x), self.num_labels, deterministic)


class BertForTokenClassification(nn.Module):
  """Per-token classifier (e.g. NER). Params {"bert", "classifier"}, and "head" (ModernBERT's
  `PredictionHead` before the classifier) when `head`."""
  config: model.BertConfig
  num_labels: int
  head: bool = False

  @nn.compact
  def __call__(self, input_ids, input_mask, segment_ids, *, deterministic: bool = True, **encoder_kwargs):
    """Returns logits [B, L, num_labels] float32."""
    # BERT's encoder keeps its (unused) pooler, so its checkpoints load as they are; ModernBERT has none.
    out = _encode(self.config, input_ids, input_mask, segment_ids, deterministic, encoder_kwargs,
                  pool=not self.head)
    x = PredictionHead(self.config, name="head")(out["sequence_output"]) if self.head else out["sequence_output"]
    return _classify(self.config, x, self.num_labels, deterministic)


class BertForQuestionAnswering(nn.Module):
  """Span start/end scores for extractive QA (Devlin et al. 2019, 4.2). Params {"bert", "qa_outputs"}, and
  "head" when `head` (ModernBERT's `PredictionHead` and dropout before the span scores, as
  ModernBertForQuestionAnswering)."""
  config: model.BertConfig
  head: bool = False

  @nn.compact
  def __call__(self, input_ids, input_mask, segment_ids, *, deterministic: bool = True, **encoder_kwargs):
    """Returns {"start_logits": [B, L], "end_logits": [B, L]} float32 (padding not masked here).

    BERT: no dropout before the span scores, as google-research/bert run_squad.py.
    """
    cfg = self.config
    out = _encode(cfg, input_ids, input_mask, segment_ids, deterministic, encoder_kwargs, pool=not self.head)
    x = out["sequence_output"]
    if self.head:
      x = dropout.Dropout(cfg.hidden_dropout, bits=cfg.dropout_bits)(PredictionHead(cfg, name="head")(x),
                                                                     deterministic=deterministic)
    logits = model.dense(cfg, 2, ("embed", None), "qa_outputs", use_bias=True)(x).astype(jnp.float32)
    return {"start_logits": logits[..., 0], "end_logits": logits[..., 1]}

"""BERT (Devlin et al. 2019, 3.1): masked LM + next-sentence prediction.

The data side is `config.data`: `format` is the instance format (bert_jax/data/instances.py; "nsp"
adds the next-sentence head, "sop" the sentence-order head of ALBERT, the one-segment formats none:
RoBERTa's "No NSP") and `masking` the scheme (bert_jax/data/masking.py). `mlm_all_positions` projects
every position to the vocabulary instead of the masked ones.
"""

import jax
import jax.numpy as jnp
import ml_collections

from bert_jax import flops
from bert_jax.models import heads
from bert_jax.objectives import base

LOSS_TERMS = {"mlm": 1.0, "nsp": 1.0}   # the sentence term is "nsp" for SOP too (the same 2-way head)
HAS_MLM_HEAD = True


def uses_sentence_head(d: ml_collections.ConfigDict) -> bool:
  """Whether the data config's instance format carries sentence labels (nsp, sop)."""
  return d.format in base.SENTENCE_FORMATS


def batch_schema(d: ml_collections.ConfigDict, batch_size: int) -> dict[str, base.Field]:
  """Of a data config: input_ids, input_mask, segment_ids [B, L]; masked_lm_* [B, P];
  next_sentence_labels [B] (nsp/sop); packing adds position_ids and example_ids [B, L] and makes the
  sentence fields [B, K]."""
  schema = {**base.token_fields(d, batch_size), **base.masked_lm_fields(d, batch_size)}
  if uses_sentence_head(d):
    schema.update(base.sentence_fields(d, batch_size))
  return schema


def validate(config: ml_collections.ConfigDict) -> list[str]:
  """Problems of a config for this objective (none: every format works)."""
  return base.format_problems(config.data, base.FORMATS, "bert")


def build_model(config: ml_collections.ConfigDict):
  return heads.BertForPreTraining(base.encoder_config(config), use_nsp=uses_sentence_head(config.data),
                                  mlm_all_positions=config.get("mlm_all_positions", False))


def loss_weights(batch: base.Batch, config=None) -> dict[str, jax.Array]:
  """The global denominators of each term: masked tokens, and sentence labels when the batch has them."""
  weights = {"mlm": jnp.sum(batch["masked_lm_weights"].astype(jnp.float32))}
  if "next_sentence_labels" in batch:
    weights["nsp"] = jnp.sum(_sentence_weights(batch))
  return weights


def _sentence_weights(batch: base.Batch) -> jax.Array:
  if "next_sentence_weights" in batch:
    return batch["next_sentence_weights"].astype(jnp.float32)
  return jnp.ones(batch["next_sentence_labels"].shape, jnp.float32)


def mlm_sums(outputs: dict, batch: base.Batch, mlm_all_positions: bool = False) -> dict[str, jax.Array]:
  """`mlm_loss_sum`, `mlm_weight`, `mlm_correct` at the masked positions.

  With `mlm_all_positions` the MLM logits are [B, L, V] and are gathered at the masked positions here. A head
  with `decoder_on_shards` gives each position's -log p(label) and correctness instead of logits.
  """
  weights = batch["masked_lm_weights"].astype(jnp.float32)
  if "mlm_nll" in outputs:
    return base.named_sums("mlm", jnp.sum(outputs["mlm_nll"] * weights), jnp.sum(outputs["mlm_correct"] * weights),
                           weights)
  logits = outputs["mlm_logits"]
  if mlm_all_positions:
    logits = jnp.take_along_axis(logits, batch["masked_lm_positions"][..., None], axis=1)
  return base.term_sums("mlm", logits, batch["masked_lm_ids"], weights)


def loss_sums(outputs: dict, batch: base.Batch, config=None) -> dict[str, jax.Array]:
  """`mlm_*` (+ `nsp_*` when the batch has sentence labels)."""
  mlm_all = bool(config is not None and config.get("mlm_all_positions", False))
  sums = mlm_sums(outputs, batch, mlm_all)
  if "next_sentence_labels" in batch and "nsp_logits" in outputs:
    sums.update(base.term_sums("nsp", outputs["nsp_logits"], batch["next_sentence_labels"], _sentence_weights(batch)))
  return sums


def loss(sums: dict, weights: dict | None = None) -> jax.Array:
  """Mean MLM loss (+ mean sentence loss); denominators default to the sums' own weights."""
  return base.loss_from_sums(sums, LOSS_TERMS, weights)


def summarize(prefix: str, sums: dict) -> dict[str, float]:
  """MLM loss/accuracy/perplexity and NSP (or SOP) loss/accuracy."""
  return base.summarize_terms(prefix, sums, LOSS_TERMS, perplexity_terms=("mlm",))


def prediction_targets(host_batch: dict):
  """(target ids, weights) of the predicted tokens, for the held-out unigram baseline."""
  return host_batch["masked_lm_ids"], host_batch["masked_lm_weights"]


def forward_flops_per_row(config: ml_collections.ConfigDict) -> dict[str, float]:
  """Forward FLOPs of one row of `BertForPreTraining` under this config, by component."""
  d = config.data
  shapes = flops.Shapes(
      seq_length=d.seq_length,
      mlm_positions=d.seq_length if config.get("mlm_all_positions", False) else d.max_predictions_per_seq,
      pooled_positions=d.max_examples_per_row if d.packing else 1,
      use_nsp=uses_sentence_head(d))
  return flops.forward_flops_per_row(base.encoder_config(config), shapes)

"""What every objective shares: the encoder config of a pretraining config, batch-schema fields,
cross-entropy sums, the loss from per-term sums and weights, and the metrics of a term."""

import dataclasses
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bert_jax.data import instances
from bert_jax.models import encoder

Batch = dict[str, jax.Array]
# The instance formats are the data layer's (bert_jax/data/instances.py); objectives choose among them.
SENTENCE_FORMATS, SINGLE_FORMATS, FORMATS = instances.SENTENCE_FORMATS, instances.SINGLE_FORMATS, instances.FORMATS
UNLABELLED_PAIR_FORMATS = instances.UNLABELLED_PAIR_FORMATS


@dataclasses.dataclass(frozen=True)
class Field:
  """One batch entry: numpy dtype, shape with the batch first, and values in [0, high) (synthetic
  batches); `high` "vocab" is the model's vocabulary size."""
  dtype: Any
  shape: tuple
  high: int | str = 1


@dataclasses.dataclass(frozen=True)
class Frozen:
  """Variables an objective reads but never trains (a distillation teacher), from `objective.frozen(config)`.

  The loop shards them like params (by their logical axis names) and passes them to the model as its
  "frozen" collection; they are outside the TrainState, so outside the optimizer state and checkpoints.
  """
  init: Callable[[Any], Any]            # rng -> the tree with logical axis names (random values: shapes only)
  load: Callable[[], Any]               # -> host arrays of the same tree (the real values, e.g. a checkpoint)
  # (freshly initialised params, frozen) -> the params a new run starts from; None: keep the fresh ones.
  init_params: Callable[[Any, Any], Any] | None = None


def encoder_config(config: ml_collections.ConfigDict) -> encoder.BertConfig:
  """`config.model` (a preset plus the fields that are set) and `config.dtype` -> BertConfig."""
  fields = {k: v for k, v in config.model.items() if k != "preset" and v is not None}
  return encoder.BertConfig.from_preset(config.model.preset, dtype=config.dtype, **fields)


def token_fields(d: ml_collections.ConfigDict, b: int) -> dict[str, Field]:
  """The encoder's inputs [B, L]; `d` is a data config. Packing adds each token's position and example
  (1..K, 0 = padding) [B, L], and where each of the row's K examples starts and whether it is there [B, K]."""
  l, k = d.seq_length, d.max_examples_per_row
  fields = {"input_ids": Field(np.int32, (b, l), "vocab"), "input_mask": Field(np.int32, (b, l), 2),
            "segment_ids": Field(np.int32, (b, l), 2)}
  if d.packing:
    fields.update(position_ids=Field(np.int32, (b, l), l), example_ids=Field(np.int32, (b, l), k + 1),
                  next_sentence_positions=Field(np.int32, (b, k), l),
                  next_sentence_weights=Field(np.float32, (b, k), 1))
  return fields


def masked_lm_fields(d: ml_collections.ConfigDict, b: int) -> dict[str, Field]:
  """The masked positions, their original ids and weights [B, P] (bert_jax/data/masking.py)."""
  p = d.max_predictions_per_seq
  return {"masked_lm_positions": Field(np.int32, (b, p), d.seq_length),
          "masked_lm_ids": Field(np.int32, (b, p), "vocab"), "masked_lm_weights": Field(np.float32, (b, p), 1)}


def sentence_fields(d: ml_collections.ConfigDict, b: int) -> dict[str, Field]:
  """Next-sentence / sentence-order labels: [B], or [B, K] when packing (one per example)."""
  return {"next_sentence_labels": Field(np.int32, (b, d.max_examples_per_row) if d.packing else (b,), 2)}


def cross_entropy_sums(logits, labels, weights) -> tuple[jax.Array, jax.Array]:
  """(weighted sum of -log p(label), weighted count of argmax == label); f32 on purpose.

  -log p(label) is logsumexp(logits) - logits[label], the label's logit picked by comparing the classes
  with it: the gradient, softmax minus the one-hot label, is then one elementwise pass over the logits.
  Picked by a gather (`take_along_axis`), its gradient is a scatter into a zeroed array of the logits'
  shape, [B, P, V] for the MLM term.
  """
  logits = logits.astype(jnp.float32)
  classes = jax.lax.broadcasted_iota(labels.dtype, logits.shape, logits.ndim - 1)
  label_logit = jnp.sum(jnp.where(classes == labels[..., None], logits, 0.0), axis=-1)
  # logsumexp, shifted by the max (a constant to autodiff); jax.nn.logsumexp also guards rows of -inf,
  # which a classification has none of, with a test for finite values the step's own guard would count.
  shift = jax.lax.stop_gradient(jnp.max(logits, axis=-1))
  nll = jnp.log(jnp.sum(jnp.exp(logits - shift[..., None]), axis=-1)) + shift - label_logit
  correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
  return jnp.sum(nll * weights), jnp.sum(correct * weights)


def term_sums(term: str, logits, labels, weights) -> dict[str, jax.Array]:
  """`<term>_loss_sum`, `<term>_weight`, `<term>_correct` of a classification over `logits`' last axis."""
  return named_sums(term, *cross_entropy_sums(logits, labels, weights), weights)


def named_sums(term: str, loss_sum, correct, weights) -> dict[str, jax.Array]:
  """A term's sums under their names: `<term>_loss_sum`, `<term>_weight` (of `weights`), `<term>_correct`."""
  return {f"{term}_loss_sum": loss_sum, f"{term}_weight": jnp.sum(weights), f"{term}_correct": correct}


def loss_from_sums(sums: dict, coefficients: dict[str, float], weights: dict | None = None) -> jax.Array:
  """sum over the terms present of coefficient * loss_sum / weight; weights default to the sums' own."""
  loss = None
  for term, coefficient in coefficients.items():
    if f"{term}_loss_sum" not in sums:
      continue
    weight = sums[f"{term}_weight"] if weights is None or term not in weights else weights[term]
    mean = sums[f"{term}_loss_sum"] / jnp.maximum(weight, 1.0)
    mean = mean if coefficient == 1 else coefficient * mean
    loss = mean if loss is None else loss + mean
  return loss


def summarize_terms(prefix: str, sums: dict, terms, perplexity_terms=()) -> dict[str, float]:
  """Means from sums: `<prefix>/<term>_loss`, `_accuracy` (and `_perplexity` for language-model terms)."""
  sums = {k: float(v) for k, v in sums.items()}
  out = {}
  for term in terms:
    weight = sums.get(f"{term}_weight")
    if not weight:
      continue
    loss = sums[f"{term}_loss_sum"] / weight
    out[f"{prefix}/{term}_loss"] = loss
    if f"{term}_correct" in sums:
      out[f"{prefix}/{term}_accuracy"] = sums[f"{term}_correct"] / weight
    if term in perplexity_terms:
      out[f"{prefix}/{term}_perplexity"] = math.exp(min(loss, 80.0))
  return out


def format_problems(d: ml_collections.ConfigDict, allowed: tuple, objective: str) -> list[str]:
  """A data format this objective cannot use, named with the objective."""
  fmt = d.format
  if fmt in allowed:
    return []
  return [f"data.format {fmt!r} cannot be used by objective {objective!r}: use one of {allowed}"]

"""SpanBERT (Joshi et al. 2020): span masking + the span boundary objective (SBO), one contiguous
segment per row, no NSP.

Masking is `data.span_masking` (whole-word spans, lengths ~ Geometric(0.2) clipped at 10, 15% budget,
80/10/10 per span; bert_jax/data/masking.py). SBO (3.2): each masked token x_i of a span x_s..x_e is
predicted from the encoder outputs at the boundaries x_{s-1}, x_{e+1} and a relative position embedding
p_{i-s+1}, through a 2-layer feed-forward network with GELU and LayerNorm, into the vocabulary projection
tied to the word embeddings (facebookresearch/SpanBERT `BertPairTargetPredictionHead`). As the release's
pretraining command has it (`--max-pair-targets 15 --pair-positional-embedding-size 200 --endpoints
external`): the position embeddings are 200 wide, only a span's first 15 tokens are boundary targets, and a
span beside [CLS] or [SEP] has none (bert_jax/data/masking.py `span_boundaries`). The loss is MLM + SBO, each
a mean over its own targets (the release's `span_bert_loss`: `lm_loss / ntokens + pair_loss / npairs`).
`sbo_max_targets` and `sbo_position_size`, fields a config may add, change the two sizes.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bert_jax import flops
from bert_jax.models import encoder
from bert_jax.models import heads
from bert_jax.models import projections
from bert_jax.models.layer_norm import layer_norm
from bert_jax.objectives import base
from bert_jax.objectives import bert

LOSS_TERMS = {"mlm": 1.0, "sbo": 1.0}
HAS_MLM_HEAD = True
SPAN_FIELDS = ("masked_lm_span_left", "masked_lm_span_right", "masked_lm_span_offset")
SBO_MAX_TARGETS, SBO_POSITION_SIZE = 15, 200   # the release's pretraining command


def batch_schema(d: ml_collections.ConfigDict, batch_size: int) -> dict[str, base.Field]:
  """BERT's MLM fields plus, per prediction slot [B, P], the span's left and right boundary positions, the
  token's offset in its span (0 .. P - 1) and whether the span has both boundaries (bert_jax/data/masking.py
  `span_boundaries`)."""
  p, l = d.max_predictions_per_seq, d.seq_length
  schema = {**base.token_fields(d, batch_size), **base.masked_lm_fields(d, batch_size)}
  schema.update({name: base.Field(np.int32, (batch_size, p), p if name.endswith("offset") else l)
                 for name in SPAN_FIELDS})
  schema["masked_lm_span_weights"] = base.Field(np.float32, (batch_size, p), 1)
  return schema


def validate(config: ml_collections.ConfigDict) -> list[str]:
  problems = base.format_problems(config.data, base.SINGLE_FORMATS, "spanbert")
  if not config.data.span_masking:
    problems.append("objective 'spanbert' predicts masked spans: set data.span_masking=True")
  for name in ("sbo_max_targets", "sbo_position_size"):
    if config.get(name, 1) < 1:
      problems.append(f"{name} must be >= 1, got {config.get(name)}")
  return problems


def _sizes(config) -> tuple[int, int]:
  """(boundary targets a span, width of their position embeddings)."""
  get = (lambda name, default: default) if config is None else config.get
  return get("sbo_max_targets", SBO_MAX_TARGETS), get("sbo_position_size", SBO_POSITION_SIZE)


class SpanBoundaryHead(nn.Module):
  """[x_{s-1}; x_{e+1}; p_{i-s}] -> (Dense, GELU, LayerNorm) x 2 -> tied vocabulary projection + bias.

  p has `max_targets` rows of `position_size`; an offset past the last row reads the last (such a token is
  no target: `sbo_weights`). The second (Dense, GELU, LayerNorm) and the projection are an MLM head of their
  own (`MaskedLMHead`).
  """
  config: encoder.BertConfig
  max_targets: int
  position_size: int

  @nn.compact
  def __call__(self, x_BLH, left_BP, right_BP, offset_BP, word_embeddings_VH):
    cfg = self.config
    h = cfg.hidden_size
    position = nn.Embed(self.max_targets, self.position_size, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                        embedding_init=encoder.dense_init(cfg, (None, None)), name="position_embeddings")
    x = jnp.concatenate([heads.gather_positions(x_BLH, left_BP), heads.gather_positions(x_BLH, right_BP),
                         position(jnp.minimum(offset_BP, self.max_targets - 1))], axis=-1)
    # The input width 2H + position_size need not divide a tensor split: the kernel's input axis is not split.
    dense = projections.linear(cfg, h, encoder.dense_init(cfg, (None, "embed")), encoder.zeros(("embed",)),
                               name="dense")
    x = layer_norm(cfg, "layer_norm")(encoder.gelu(cfg, dense(x)))
    return heads.MaskedLMHead(cfg, name="output")(x, word_embeddings_VH)


class SpanBertForPreTraining(nn.Module):
  """Encoder + MLM head + SBO head. Params {"bert", "mlm", "sbo"}."""
  config: encoder.BertConfig
  max_targets: int = SBO_MAX_TARGETS
  position_size: int = SBO_POSITION_SIZE

  @nn.compact
  def __call__(self, batch: dict, *, deterministic: bool = True) -> dict:
    """Returns {"mlm_logits": [B, P, V], "sbo_logits": [B, P, V]} float32."""
    bert_encoder = encoder.BertEncoder(self.config, name="bert")
    out = bert_encoder(batch["input_ids"], batch["input_mask"], batch["segment_ids"], deterministic=deterministic,
                       **{k: batch[k] for k in ("position_ids", "example_ids") if k in batch})
    x, table = out["sequence_output"], bert_encoder.word_embeddings()
    mlm = heads.MaskedLMHead(self.config, name="mlm")(heads.gather_positions(x, batch["masked_lm_positions"]), table)
    sbo = SpanBoundaryHead(self.config, self.max_targets, self.position_size, name="sbo")(
        x, batch["masked_lm_span_left"], batch["masked_lm_span_right"], batch["masked_lm_span_offset"], table)
    return {"mlm_logits": mlm, "sbo_logits": sbo}


def build_model(config: ml_collections.ConfigDict):
  return SpanBertForPreTraining(base.encoder_config(config), *_sizes(config))


def sbo_weights(batch: base.Batch, config=None) -> jax.Array:
  """[B, P]: 1 at the boundary targets, the masked tokens among the first `sbo_max_targets` of a span with both
  boundaries (the release's `pair_targets`, `pad_to_len` keeping each span's first max-pair-targets)."""
  max_targets, _ = _sizes(config)
  inside = batch["masked_lm_span_offset"] < max_targets
  return jnp.where(inside, batch["masked_lm_span_weights"].astype(jnp.float32), 0.0)


def loss_weights(batch: base.Batch, config=None) -> dict[str, jax.Array]:
  return {"mlm": jnp.sum(batch["masked_lm_weights"].astype(jnp.float32)), "sbo": jnp.sum(sbo_weights(batch, config))}


def loss_sums(outputs: dict, batch: base.Batch, config=None) -> dict[str, jax.Array]:
  """`mlm_*` at every masked position; `sbo_*` at the boundary targets (`sbo_weights`)."""
  return {**bert.mlm_sums(outputs, batch),
          **base.term_sums("sbo", outputs["sbo_logits"], batch["masked_lm_ids"], sbo_weights(batch, config))}


def loss(sums: dict, weights: dict | None = None) -> jax.Array:
  return base.loss_from_sums(sums, LOSS_TERMS, weights)


def summarize(prefix: str, sums: dict) -> dict[str, float]:
  return base.summarize_terms(prefix, sums, LOSS_TERMS, perplexity_terms=("mlm",))


prediction_targets = bert.prediction_targets


def forward_flops_per_row(config: ml_collections.ConfigDict) -> dict[str, float]:
  """BERT's without NSP, plus the SBO head on the P masked positions."""
  d = config.data
  cfg = base.encoder_config(config)
  counts = flops.forward_flops_per_row(cfg, flops.Shapes(d.seq_length, d.max_predictions_per_seq, use_nsp=False))
  h, e, p = cfg.hidden_size, cfg.embedding_dim, d.max_predictions_per_seq
  # [x_{s-1}; x_{e+1}; p] (2H + the position size) -> H, then an MLM head of its own: H -> E, and the decoder
  # tied to the E-wide word embeddings.
  counts["sbo_mlp"] = float(p * (2 * (2 * h + _sizes(config)[1]) * h + 2 * h * e))
  counts["sbo_decoder"] = float(p * 2 * e * cfg.vocab_size)
  return counts

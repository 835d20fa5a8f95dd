"""ELECTRA (Clark et al. 2020): replaced token detection with a small MLM generator.

A generator (an MLM encoder `generator_hidden_fraction` of the discriminator's width: 1/4 for small and
large, 1/3 for base, appendix A Table 6 and 3.2) fills the masked positions with samples from its softmax;
the discriminator (the model kept: its encoder is "bert", so finetuning, embedding and export use it)
classifies every real token as original or replaced. A sample equal to the original token counts as
original (3.1). Loss = generator MLM + 50 x discriminator loss (lambda = 50, 3.1).

The two share the token, position and type embeddings (3.2, "weight sharing"): the generator reads the
discriminator's embedding tables (width E = `embedding_size`, or the hidden size) through its own
projection to its hidden size when they differ, as transformers' `ElectraForMaskedLM`. Params:
{"bert": discriminator encoder, "discriminator": {"dense", "prediction"}, "generator": {"projection"?,
"encoder", "mlm"}}. Sampling is not differentiated (3.1: the discriminator loss is not back-propagated
through the sampler); in training its key is drawn from the "dropout" rng stream, at evaluation
(`deterministic`) a fixed key, so held-out losses are comparable across steps.

The masked positions come from the data pipeline (`data.masking`, 15%; 25% for large, Table 6).
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from bert_jax import flops
from bert_jax.models import encoder
from bert_jax.models import heads
from bert_jax.models import projections
from bert_jax.models.embeddings import default_position_ids, packed_position_ids
from bert_jax.models.layer_norm import layer_norm
from bert_jax.objectives import base
from bert_jax.objectives import bert

LOSS_TERMS = {"mlm": 1.0, "disc": 50.0}   # lambda = 50 (3.1)
HAS_MLM_HEAD = False   # the generator's MLM head is under "generator", not the kept model's "mlm"
DEFAULT_GENERATOR_FRACTION = 0.25
_EVAL_SAMPLING_SEED = 0


def batch_schema(d: ml_collections.ConfigDict, batch_size: int) -> dict[str, base.Field]:
  """BERT's token and MLM fields; no sentence labels."""
  return {**base.token_fields(d, batch_size), **base.masked_lm_fields(d, batch_size)}


def validate(config: ml_collections.ConfigDict) -> list[str]:
  """The data format, and a generator no larger than the discriminator (3.2: a smaller generator works best;
  a larger one would also not fit the discriminator's embedding width)."""
  problems = base.format_problems(config.data, base.UNLABELLED_PAIR_FORMATS + base.SINGLE_FORMATS, "electra")
  fraction = config.get("generator_hidden_fraction", DEFAULT_GENERATOR_FRACTION)
  if not 0 < fraction <= 1:
    return problems + [f"generator_hidden_fraction {fraction} must be in (0, 1]: the generator may not be larger "
                       "than the discriminator"]
  cfg = base.encoder_config(config)
  try:
    gen = generator_config(cfg, fraction)
  except ValueError as e:
    return problems + [f"generator_hidden_fraction {fraction}: the generator's sizes do not fit ({e})"]
  for name in ("hidden_size", "num_heads", "intermediate_size"):
    if getattr(gen, name) > getattr(cfg, name):
      problems.append(f"generator_hidden_fraction {fraction} gives a generator {name} {getattr(gen, name)} larger "
                      f"than the discriminator's {getattr(cfg, name)}")
  return problems


def other_encoders(config: ml_collections.ConfigDict) -> list[encoder.BertConfig]:
  """The generator's config, beside the discriminator's (`run_checks.validate` checks the mesh against both)."""
  return [generator_config(base.encoder_config(config),
                           config.get("generator_hidden_fraction", DEFAULT_GENERATOR_FRACTION))]


def generator_config(cfg: encoder.BertConfig, fraction: float) -> encoder.BertConfig:
  """The generator: width, heads and intermediate size scaled by `fraction` (as the ELECTRA release's
  `generator_hidden_size`), reading embeddings of the discriminator's width E."""
  hidden = int(round(cfg.hidden_size * fraction))
  return dataclasses.replace(cfg, hidden_size=hidden, num_heads=max(1, int(round(cfg.num_heads * fraction))),
                             intermediate_size=int(round(cfg.intermediate_size * fraction)),
                             embedding_size=cfg.embedding_dim, share_layers=False)


class Generator(nn.Module):
  """Shared embeddings (given) -> projection to the generator width -> layers -> MLM head at the masked
  positions. Params {"projection" (when E != its hidden size), "encoder", "final_layer_norm" (with
  `final_norm`), "mlm"}."""
  config: encoder.BertConfig

  @nn.compact
  def __call__(self, x_BLE, context, positions_BP, word_embeddings_VE, deterministic: bool):
    """`context`: `encoder.layer_context` of this generator's config (its RoPE tables are of its head size)."""
    cfg = self.config
    if cfg.embedding_dim != cfg.hidden_size:
      x_BLE = projections.linear(cfg, cfg.hidden_size, encoder.dense_init(cfg, (None, "embed")),
                                 encoder.zeros(("embed",)), name="projection")(x_BLE)
    x, _, _ = encoder.BertLayerStack(cfg, name="encoder")(x_BLE, context, deterministic, False)
    if cfg.final_norm:   # pre-norm layers: the stack's output normalized, as the discriminator's
      x = layer_norm(cfg, "final_layer_norm")(x)
    return heads.MaskedLMHead(cfg, name="mlm")(heads.gather_positions(x, positions_BP), word_embeddings_VE)


class DiscriminatorHead(nn.Module):
  """transformers' ElectraDiscriminatorPredictions: dense, hidden_act, dense to one logit per token."""
  config: encoder.BertConfig

  @nn.compact
  def __call__(self, x_BLH):
    cfg = self.config
    dense = lambda n, names, name: projections.linear(cfg, n, encoder.dense_init(cfg, names),  # noqa: E731
                                                      encoder.zeros(names[-1:]), name=name)
    x = encoder.gelu(cfg, dense(cfg.hidden_size, ("embed", "mlp"), "dense")(x_BLH))
    return dense(1, ("mlp", None), "prediction")(x)[..., 0].astype(jnp.float32)


def replace_masked(input_ids, positions_BP, weights_BP, tokens_BP):
  """input_ids with tokens_BP written at the masked positions whose weight is > 0 (padding slots skipped)."""
  input_ids, b = jnp.asarray(input_ids), jnp.arange(input_ids.shape[0])[:, None]
  current = input_ids[b, positions_BP]
  return input_ids.at[b, positions_BP].set(jnp.where(weights_BP > 0, tokens_BP, current))


class ElectraForPreTraining(nn.Module):
  """Generator + discriminator over shared embeddings (see the module docstring for the params)."""
  config: encoder.BertConfig
  generator_hidden_fraction: float = DEFAULT_GENERATOR_FRACTION

  @nn.compact
  def __call__(self, batch: dict, *, deterministic: bool = True) -> dict:
    """Returns {"mlm_logits": [B, P, V], "disc_logits": [B, L], "replaced": [B, L] (0/1 labels)}."""
    cfg = self.config
    ids, positions = batch["input_ids"], batch["masked_lm_positions"]
    weights = batch["masked_lm_weights"]
    optional = {k: batch[k] for k in ("position_ids", "example_ids") if k in batch}
    # The table's rows, as the encoder takes them from the same batch (`BertEncoder.__call__`).
    position_ids = packed_position_ids(cfg, optional.get("position_ids"), optional.get("example_ids"))
    bert_encoder = encoder.BertEncoder(cfg, name="bert")
    x = bert_encoder.embeddings.embed(ids, batch["segment_ids"], position_ids, deterministic)
    table = bert_encoder.word_embeddings()
    gen_cfg = generator_config(cfg, self.generator_hidden_fraction)
    # The discriminator's attention as its layers see it: the mask, RoPE and sliding windows (a bare mask
    # would leave a RoPE generator without any positions).
    context = encoder.layer_context(gen_cfg, batch["input_mask"], optional.get("example_ids"),
                                    default_position_ids(cfg, ids) if position_ids is None else position_ids)
    mlm_logits = Generator(gen_cfg, name="generator")(x, context, positions, table, deterministic)
    key = jax.random.key(_EVAL_SAMPLING_SEED) if deterministic else self.make_rng("dropout")
    sampled = jax.random.categorical(key, jax.lax.stop_gradient(mlm_logits))  # [B, P]
    original = replace_masked(ids, positions, weights, batch["masked_lm_ids"])
    corrupted = replace_masked(ids, positions, weights, sampled)
    # No pooler: transformers' ElectraModel has none, and nothing here reads [CLS].
    out = bert_encoder(corrupted, batch["input_mask"], batch["segment_ids"], deterministic=deterministic,
                       pool=False, **optional)
    return {"mlm_logits": mlm_logits, "disc_logits": DiscriminatorHead(cfg, name="discriminator")(out["sequence_output"]),
            "replaced": (corrupted != original).astype(jnp.int32)}


def hf_models(cfg: encoder.BertConfig, params: dict, fraction: float = DEFAULT_GENERATOR_FRACTION) -> dict:
  """Our params as transformers' two models: {"discriminator": (cfg, {"bert", "discriminator"}),
  "generator": (its cfg, {"bert", "mlm"})}, each for `checkpoints_hf.save_hf(..., model_type="electra")`.

  The generator gets copies of the shared embedding tables (and its own projection); neither has a pooler.
  """
  gen_cfg = generator_config(cfg, fraction)
  if gen_cfg.embedding_size == gen_cfg.hidden_size:
    gen_cfg = dataclasses.replace(gen_cfg, embedding_size=None)   # no embeddings_project, as transformers
  tables = {k: v for k, v in params["bert"]["embeddings"].items() if k != "projection"}
  gen = params["generator"]
  embeddings = {**tables, **({"projection": gen["projection"]} if "projection" in gen else {})}
  return {"discriminator": (cfg, {"bert": params["bert"], "discriminator": params["discriminator"]}),
          "generator": (gen_cfg, {"bert": {"embeddings": embeddings, "encoder": gen["encoder"]}, "mlm": gen["mlm"]})}


def build_model(config: ml_collections.ConfigDict):
  return ElectraForPreTraining(base.encoder_config(config),
                               config.get("generator_hidden_fraction", DEFAULT_GENERATOR_FRACTION))


def loss_weights(batch: base.Batch, config=None) -> dict[str, jax.Array]:
  """Masked tokens (generator) and real tokens (discriminator)."""
  return {"mlm": jnp.sum(batch["masked_lm_weights"].astype(jnp.float32)),
          "disc": jnp.sum(batch["input_mask"].astype(jnp.float32))}


def disc_sums(outputs: dict, batch: base.Batch) -> dict[str, jax.Array]:
  """Sigmoid cross-entropy of original (0) / replaced (1) over the real tokens; f32 on purpose."""
  logits, labels = outputs["disc_logits"].astype(jnp.float32), outputs["replaced"].astype(jnp.float32)
  weights = batch["input_mask"].astype(jnp.float32)
  nll = jnp.maximum(logits, 0) - logits * labels + jnp.log1p(jnp.exp(-jnp.abs(logits)))
  correct = ((logits > 0) == (labels > 0)).astype(jnp.float32)
  predicted, actual = (logits > 0).astype(jnp.float32) * weights, labels * weights   # positive = replaced
  return {"disc_loss_sum": jnp.sum(nll * weights), "disc_weight": jnp.sum(weights),
          "disc_correct": jnp.sum(correct * weights),
          # Counts, not ratios, so precision, recall and F1 add up exactly over micro-batches, shards and hosts.
          "disc_true_positives": jnp.sum(predicted * actual), "disc_predicted_positives": jnp.sum(predicted),
          "disc_actual_positives": jnp.sum(actual)}


def loss_sums(outputs: dict, batch: base.Batch, config=None) -> dict[str, jax.Array]:
  """`mlm_*` of the generator at the masked positions and `disc_*` of the discriminator."""
  del config
  return {**bert.mlm_sums(outputs, batch), **disc_sums(outputs, batch)}


def loss(sums: dict, weights: dict | None = None) -> jax.Array:
  return base.loss_from_sums(sums, LOSS_TERMS, weights)


def summarize(prefix: str, sums: dict) -> dict[str, float]:
  """Generator MLM loss/accuracy/perplexity; discriminator loss, accuracy over the real tokens and
  replaced-token precision, recall and F1 (positive = replaced; 0 where a denominator is 0), as the release's
  `disc_precision` / `disc_recall` (run_pretraining.py `metric_fn`)."""
  out = base.summarize_terms(prefix, sums, LOSS_TERMS, perplexity_terms=("mlm",))
  if "disc_true_positives" in sums:
    tp, predicted, actual = (float(sums[f"disc_{k}_positives"]) for k in ("true", "predicted", "actual"))
    ratio = lambda a, b: a / b if b else 0.0
    out.update({f"{prefix}/disc_precision": ratio(tp, predicted), f"{prefix}/disc_recall": ratio(tp, actual),
                f"{prefix}/disc_f1": ratio(2 * tp, predicted + actual)})
  return out


prediction_targets = bert.prediction_targets   # the generator's masked tokens


def forward_flops_per_row(config: ml_collections.ConfigDict) -> dict[str, float]:
  """The discriminator (encoder without a pooler, head at every token) and the generator (layers, MLM head
  at the masked positions), by component."""
  cfg, d = base.encoder_config(config), config.data
  gen_cfg = generator_config(cfg, config.get("generator_hidden_fraction", DEFAULT_GENERATOR_FRACTION))
  disc = flops.forward_flops_per_row(cfg, flops.Shapes(d.seq_length, 0, 0, False))
  if gen_cfg.embedding_dim == gen_cfg.hidden_size:   # the generator projects only where the widths differ
    gen_cfg = dataclasses.replace(gen_cfg, embedding_size=None)
  gen = flops.forward_flops_per_row(gen_cfg, flops.Shapes(d.seq_length, d.max_predictions_per_seq, 0, False))
  disc["discriminator_head"] = float(d.seq_length * 2 * cfg.hidden_size * (cfg.hidden_size + 1))
  return {**disc, **{f"generator_{k}": v for k, v in gen.items()}}

"""Left-to-right LM (Devlin et al. 2019, 5.1 and Table 5, "LTR & No NSP"): the BERT encoder under a
causal mask predicts every next token; no masking, no sentence objective.

The encoder config must say `model.causal = True`: the run record beside the checkpoints carries it,
so finetuning from an LTR checkpoint keeps the causal mask, as the paper's LTR model does.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from bert_jax import flops
from bert_jax.models import encoder
from bert_jax.models import heads
from bert_jax.objectives import base

LOSS_TERMS = {"lm": 1.0}
HAS_MLM_HEAD = False


def batch_schema(d: ml_collections.ConfigDict, batch_size: int) -> dict[str, base.Field]:
  """The encoder's inputs only: the targets are the inputs shifted by one."""
  return base.token_fields(d, batch_size)


def validate(config: ml_collections.ConfigDict) -> list[str]:
  problems = base.format_problems(config.data, base.SINGLE_FORMATS, "ltr")
  if not config.model.get("causal"):
    problems.append("objective 'ltr' needs model.causal=True (a left-to-right model must not see the future)")
  if config.data.packing:
    problems.append("objective 'ltr' does not pack rows (data.packing=False)")
  return problems


class LeftToRightLM(nn.Module):
  """Causal encoder + the MLM head at every position. Params {"bert", "mlm"} as `BertForPreTraining`."""
  config: encoder.BertConfig

  @nn.compact
  def __call__(self, batch: dict, *, deterministic: bool = True) -> dict:
    """Returns {"lm_logits": [B, L, V]} float32: position i scores token i + 1."""
    bert = encoder.BertEncoder(self.config, name="bert")
    out = bert(batch["input_ids"], batch["input_mask"], batch["segment_ids"], deterministic=deterministic)
    return {"lm_logits": heads.MaskedLMHead(self.config, name="mlm")(out["sequence_output"], bert.word_embeddings())}


def build_model(config: ml_collections.ConfigDict):
  return LeftToRightLM(base.encoder_config(config))


def _targets(batch):
  """(next token [B, L-1], weight [B, L-1]): position i predicts i + 1 when both are real tokens."""
  mask = batch["input_mask"].astype(jnp.float32)
  return batch["input_ids"][:, 1:], mask[:, 1:] * mask[:, :-1]


def loss_weights(batch: base.Batch, config=None) -> dict[str, jax.Array]:
  return {"lm": jnp.sum(_targets(batch)[1])}


def loss_sums(outputs: dict, batch: base.Batch, config=None) -> dict[str, jax.Array]:
  """`lm_loss_sum`, `lm_weight`, `lm_correct` over every next-token prediction."""
  del config
  labels, weights = _targets(batch)
  return base.term_sums("lm", outputs["lm_logits"][:, :-1], labels, weights)


def loss(sums: dict, weights: dict | None = None) -> jax.Array:
  return base.loss_from_sums(sums, LOSS_TERMS, weights)


def summarize(prefix: str, sums: dict) -> dict[str, float]:
  """Next-token loss, accuracy and perplexity."""
  return base.summarize_terms(prefix, sums, LOSS_TERMS, perplexity_terms=("lm",))


prediction_targets = _targets   # numpy in, numpy out


def forward_flops_per_row(config: ml_collections.ConfigDict) -> dict[str, float]:
  """The encoder, the unused pooler and the vocabulary projection at every position."""
  s = config.data.seq_length
  shapes = flops.Shapes(seq_length=s, mlm_positions=s, use_nsp=False)
  return flops.forward_flops_per_row(base.encoder_config(config), shapes)

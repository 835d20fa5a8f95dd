"""ModernBERT (Warner et al. 2024, arXiv:2412.13663): masked LM alone, on the ModernBERT encoder.

RoBERTa's objective (no next-sentence prediction, one-segment inputs) with what differs in the model:
the encoder's ModernBERT switches (rotary positions, GeGLU, pre-norm, bias-free norms and projections,
alternating global / sliding-window attention, a final norm), no token types and no pooler, as in
Hugging Face's ModernBertForMaskedLM; the MLM head is `heads.MaskedLMHead` with ModernBERT's biases. Its
recipe masks 30% of the tokens and packs documents into rows (`data.packing`), each attending to itself
only (configs/modernbert_base.py). The loss, metrics and batch schema are BERT's without the sentence term.
"""

import ml_collections

from bert_jax import flops
from bert_jax.models import heads
from bert_jax.objectives import base
# What BERT has and this objective keeps as it is.
from bert_jax.objectives.bert import (  # pylint: disable=unused-import  (kept as BERT has them)
    batch_schema, loss_weights, loss_sums, loss, summarize, prediction_targets)

LOSS_TERMS = {"mlm": 1.0}
HAS_MLM_HEAD = True


def validate(config: ml_collections.ConfigDict) -> list[str]:
  """One-segment formats only; the encoder must be a ModernBERT one (some switch set) without token types."""
  problems = base.format_problems(config.data, base.SINGLE_FORMATS, "modernbert")
  cfg = base.encoder_config(config)
  if cfg.model_type != "modernbert":
    problems.append("objective 'modernbert' needs ModernBERT's encoder switches in config.model "
                    "(rope_theta, geglu, pre_norm, ...; see configs/modernbert_base.py)")
  if cfg.type_vocab_size:
    problems.append(f"objective 'modernbert' has no token types: set model.type_vocab_size 0, "
                    f"not {cfg.type_vocab_size}")
  return problems


def build_model(config: ml_collections.ConfigDict):
  return heads.BertForPreTraining(base.encoder_config(config), use_nsp=False, pool=False,
                                  mlm_all_positions=config.get("mlm_all_positions", False))


def forward_flops_per_row(config: ml_collections.ConfigDict) -> dict[str, float]:
  """Forward FLOPs of one row, by component: BERT's count without pooler (flops.py counts GeGLU's third
  matrix and, with the splash kernel, sliding-window layers over their window only)."""
  d, cfg = config.data, base.encoder_config(config)
  shapes = flops.Shapes(seq_length=d.seq_length, use_nsp=False, pooled_positions=0,
                        mlm_positions=d.seq_length if config.get("mlm_all_positions", False) else d.max_predictions_per_seq)
  return flops.forward_flops_per_row(cfg, shapes)

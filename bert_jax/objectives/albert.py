"""ALBERT (Lan et al. 2019): masked LM (n-gram masking, 4.1) + sentence-order prediction (3.2) on a
factorized-embedding, cross-layer-shared encoder (`model.embedding_size`, `model.share_layers`).

The heads and loss are BERT's (the 2-way sentence head scores order instead of adjacency); what
makes it ALBERT is the data format "sop" and the encoder fields, which `validate` asks for.
"""

import ml_collections

from bert_jax.objectives import base
from bert_jax.objectives import bert

# What BERT has and this objective keeps as it is.
from bert_jax.objectives.bert import (  # pylint: disable=unused-import
    LOSS_TERMS, batch_schema, build_model, loss_weights, loss_sums, loss, prediction_targets, forward_flops_per_row)

HAS_MLM_HEAD = True


def summarize(prefix: str, sums: dict) -> dict[str, float]:
  """MLM loss/accuracy/perplexity and sentence-order loss/accuracy (`sop_*`)."""
  out = bert.summarize(prefix, sums)
  return {k.replace(f"{prefix}/nsp_", f"{prefix}/sop_"): v for k, v in out.items()}


def validate(config: ml_collections.ConfigDict) -> list[str]:
  problems = base.format_problems(config.data, ("sop",), "albert")
  if not config.model.get("share_layers"):
    problems.append("objective 'albert' shares its layers: set model.share_layers=True")
  return problems

"""RoBERTa (Liu et al. 2019): BERT's masked LM without next-sentence prediction, on one-segment
inputs (FULL-SENTENCES or DOC-SENTENCES, 4.2), with dynamic masking (which the input pipeline always
does) and byte-level BPE (bert_jax/data/tokenizer.py). The model and loss are BERT's MLM."""

import ml_collections

from bert_jax.objectives import base
# What BERT has and this objective keeps as it is.
from bert_jax.objectives.bert import (  # pylint: disable=unused-import  (kept as BERT has them)
    batch_schema, build_model, loss_weights, loss_sums, loss, summarize, prediction_targets, forward_flops_per_row)

LOSS_TERMS = {"mlm": 1.0}
HAS_MLM_HEAD = True


def validate(config: ml_collections.ConfigDict) -> list[str]:
  return base.format_problems(config.data, base.SINGLE_FORMATS, "roberta")

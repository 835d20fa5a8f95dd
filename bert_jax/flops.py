"""Analytic FLOPs of the encoder and its pretraining heads, for MFU and step-time estimates.

Each objective (bert_jax/objectives/) counts its model with these; `objectives.train_flops_per_step`
is the figure of a train config.

Only matrix multiplications are counted, 2 FLOPs per multiply-add, as in the usual definition of
model FLOPs utilization (Chowdhery et al. 2022, PaLM, appendix B): layer norms, softmax, GELU,
dropout and the optimizer update are a few percent for BERT shapes and are left out. Embedding
lookups are gathers (0 FLOPs). The backward pass costs twice the forward pass (one matmul for the
input gradient, one for the weight gradient), so a train step is 3x the forward pass; recomputation
under remat is not counted (it is hardware FLOPs, not model FLOPs).

Attention is counted over the full sequence length whatever the padding, packing or sliding window
(ModernBERT's local layers): the fused attention path computes every (query, key) score and masks
afterwards.
"""

import dataclasses

from bert_jax.models import encoder as model


@dataclasses.dataclass(frozen=True)
class Shapes:
  """What one forward pass computes, per sequence (row) of the batch."""
  seq_length: int             # S: tokens per row (attention span)
  mlm_positions: int          # positions projected to the vocabulary: P, or S for all positions
  pooled_positions: int = 1   # [CLS] vectors through the pooler: 1, or K when packing
  use_nsp: bool = True        # the 2-way sentence classifier on the pooled vectors


def forward_flops_per_row(cfg: model.BertConfig, shapes: Shapes) -> dict[str, float]:
  """Forward-pass FLOPs of one row of `BertForPreTraining`, by component."""
  h, i, s, v = cfg.hidden_size, cfg.intermediate_size, shapes.seq_length, cfg.vocab_size
  per_layer_per_token = {
      "attention_qkv": 3 * 2 * h * h,
      "attention_scores": 2 * s * h,   # q . k over all S keys, summed over heads: H = heads x head_dim
      "attention_values": 2 * s * h,   # probs x v
      "attention_out": 2 * h * h,
      # intermediate (to 2 x I with GeGLU: input and gate halves) and output dense
      "mlp": 2 * (3 if cfg.geglu else 2) * h * i,
  }
  flops = {k: float(cfg.num_layers * s * f) for k, f in per_layer_per_token.items()}
  e = getattr(cfg, "embedding_size", None) or h
  flops["embeddings"] = float(s * 2 * e * h) if e != h else 0.0  # gathers and adds; ALBERT projects E -> H
  flops["pooler"] = float(shapes.pooled_positions * 2 * h * h)
  flops["nsp"] = float(shapes.pooled_positions * 2 * h * 2) if shapes.use_nsp else 0.0
  flops["mlm_transform"] = float(shapes.mlm_positions * 2 * h * e)   # H -> E (E = H but for ALBERT)
  flops["mlm_decoder"] = float(shapes.mlm_positions * 2 * e * v)  # tied to the word embeddings
  return flops


def train_flops_per_row(cfg: model.BertConfig, shapes: Shapes) -> float:
  """Forward + backward FLOPs of one row: 3x the forward pass."""
  return 3.0 * sum(forward_flops_per_row(cfg, shapes).values())

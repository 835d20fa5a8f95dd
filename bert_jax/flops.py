"""Analytic FLOPs of the encoder and its pretraining heads, for MFU and step-time estimates.

Each objective (bert_jax/objectives/) counts its model with these; `objectives.train_flops_per_step`
is the figure of a train config.

Only matrix multiplications are counted, 2 FLOPs per multiply-add, as in the usual definition of
model FLOPs utilization (Chowdhery et al. 2022, PaLM, appendix B): layer norms, softmax, GELU,
dropout and the optimizer update are a few percent for BERT shapes and are left out. Embedding
lookups are gathers (0 FLOPs). The backward pass costs twice the forward pass (one matmul for the
input gradient, one for the weight gradient), so a train step is 3x the forward pass; recomputation
under remat is not counted (it is hardware FLOPs, not model FLOPs).

Attention is counted over the full sequence length whatever the padding or packing. So are sliding-window
layers (ModernBERT's local layers) on the dense path (`attention_kernel` "xla"), which computes every
(query, key) score and masks afterwards; with the splash kernel, which skips the blocks outside the window,
a local layer counts the window+1 keys each query attends to.
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
      "attention_out": 2 * h * h,
      # intermediate (to 2 x I with GeGLU: input and gate halves) and output dense
      "mlp": 2 * (3 if cfg.geglu else 2) * h * i,
  }
  flops = {k: float(cfg.num_layers * s * f) for k, f in per_layer_per_token.items()}
  keys = sum(attended_keys(cfg, s))   # over the layers
  flops["attention_scores"] = float(s * keys * 2 * h)   # q . k, summed over heads: H = heads x head_dim
  flops["attention_values"] = float(s * keys * 2 * h)   # probs x v
  e = getattr(cfg, "embedding_size", None) or h
  flops["embeddings"] = float(s * 2 * e * h) if e != h else 0.0  # gathers and adds; ALBERT projects E -> H
  flops["pooler"] = float(shapes.pooled_positions * 2 * h * h)
  flops["nsp"] = float(shapes.pooled_positions * 2 * h * 2) if shapes.use_nsp else 0.0
  flops["mlm_transform"] = float(shapes.mlm_positions * 2 * h * e)   # H -> E (E = H but for ALBERT)
  flops["mlm_decoder"] = float(shapes.mlm_positions * 2 * e * v)  # tied to the word embeddings
  return flops


def attended_keys(cfg: model.BertConfig, seq_length: int) -> list[int]:
  """Keys each query's scores are counted over, per layer (see the module docstring)."""
  window = min(seq_length, cfg.local_attention + 1) if cfg.local_attention is not None else seq_length
  splash = cfg.attention_kernel != "xla"
  return [window if local and splash else seq_length for local, _ in model.layer_kinds(cfg)]


def kernel_attention_per_row(cfg: model.BertConfig, seq_length: int, bytes_per_element: int = 2) -> tuple:
  """(FLOPs, HBM bytes) of one row's attention inside the splash kernel over a train step (forward and
  backward); (0, 0) when attention runs as XLA ops. XLA's cost analysis cannot see into the kernel (a
  custom call), so `bert-jax aot` adds these to its counts.

  FLOPs: 3x the forward scores and values. Bytes, an estimate from the kernel's blocking: the forward pass
  reads q and writes o once and reads k and v once per query block that reaches them (all S / block of them
  in a global layer, the few a window spans in a local one); the backward passes (dq, then dk and dv) read
  about twice that.
  """
  from bert_jax.models import splash  # pylint: disable=g-import-not-at-top
  if cfg.attention_kernel == "xla" or cfg.attention_dropout > 0:   # dropout takes the explicit path
    return 0.0, 0.0
  h, s = cfg.hidden_size, seq_length
  block = next(b for b in splash.BLOCKS if s % b == 0)
  flops = bytes_ = 0.0
  for keys in attended_keys(cfg, s):
    flops += 3 * 2 * (2 * s * keys * h)
    rereads = s // block if keys >= s else min(s // block, -(-keys // block) + 1)
    bytes_ += 3 * bytes_per_element * h * s * (2 + 2 * rereads)
  return flops, bytes_


def train_flops_per_row(cfg: model.BertConfig, shapes: Shapes) -> float:
  """Forward + backward FLOPs of one row: 3x the forward pass."""
  return 3.0 * sum(forward_flops_per_row(cfg, shapes).values())

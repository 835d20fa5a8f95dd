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
  # Gathers and adds; a projection E -> H wherever an embedding size is set (ALBERT, ELECTRA-small), E = H too.
  flops["embeddings"] = float(s * 2 * e * h) if getattr(cfg, "embedding_size", None) is not None else 0.0
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


def kernel_attention_per_row(cfg: model.BertConfig, seq_length: int) -> dict[str, float]:
  """One row's attention inside the splash or flash kernel over a train step, which XLA's cost analysis
  cannot see (a custom call): `bert-jax aot` adds it to XLA's counts. All 0 when attention runs as XLA ops
  (splash's with attention dropout, which takes the explicit path).

  - "model_flops": the model count's share (3x the forward scores and values, `forward_flops_per_row`).
  - "flops": what the kernel computes. Splash works in blocks of keys: a query block of a sliding-window
    layer computes every key block its window reaches (3 for a window inside one block's width, 2 at the
    sequence's two ends; not 129 keys), a causal layer the blocks on and below the diagonal; its backward
    kernels recompute the scores: dq takes 3 matmuls, dk and dv 4, against the forward's 2. Flash
    (`flash_dropout`) computes every key: 2 matmuls forward, 5 backward (the scores again, then the values',
    probabilities', keys' and queries').
  - "bytes": what the kernels read beyond one read of each operand (`hlo_bytes` counts each kernel's
    operands and results once, as stored; XLA's cost analysis counts a kernel that declares no cost as
    moving nothing, and `aot` adds that count). Splash's, an estimate from that blocking: the forward pass
    reads k and v once per query block that reaches them, and its backward passes read about twice as
    much again (the dkv pass takes q and the output's gradient once per key block). Flash reads the
    queries' segment ids once per head in each pass (int32 [1, length] rows, 2 sublanes a tile, `T(2,128)`,
    as compiled for v3); its other operands once.
  """
  from bert_jax.models import splash  # pylint: disable=g-import-not-at-top
  out = {"model_flops": 0.0, "flops": 0.0, "bytes": 0.0}
  flash = cfg.attention_kernel.startswith("flash")
  if not flash and (cfg.attention_kernel == "xla" or cfg.attention_dropout > 0):
    return out
  h, s, itemsize = cfg.hidden_size, seq_length, cfg.dtype.itemsize
  block = None if flash else splash.block_size(s)
  for keys in attended_keys(cfg, s):
    out["model_flops"] += 3 * 2 * (2 * s * keys * h)
    if flash:
      out["flops"] += (2 + 5) * 2 * s * keys * h
      out["bytes"] += 2 * (cfg.num_heads - 1) * s * 4 * 2
    else:
      # (query block, key block) pairs computed: all of them, or each query block's own and those its
      # half-window reaches on either side that exist (fewer at the sequence's ends); a causal mask's
      # blocks above the diagonal are skipped (one side only).
      n = s // block
      reach = n if keys >= s else -(-(keys // 2) // block)
      pairs = n + (1 if cfg.causal else 2) * sum(max(n - d, 0) for d in range(1, reach + 1))
      out["flops"] += (2 + 3 + 4) * 2 * pairs * block * block * h
      out["bytes"] += 3 * itemsize * h * block * 2 * (pairs - n)
  return out


def train_flops_per_row(cfg: model.BertConfig, shapes: Shapes) -> float:
  """Forward + backward FLOPs of one row: 3x the forward pass."""
  return 3.0 * sum(forward_flops_per_row(cfg, shapes).values())

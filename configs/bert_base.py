"""BERT-base pretraining as in Devlin et al. 2019 (arXiv:1810.04805), Appendix A.2.

    bert-jax pretrain --config=configs/bert_base.py:phase1 --workdir=gs://bucket/bert_base/phase1 \
        --config.data.train_files=gs://bucket/prepared/train --config.data.vocab_file=gs://bucket/vocab.txt
    bert-jax pretrain --config=configs/bert_base.py:phase2 --workdir=gs://bucket/bert_base/phase2 \
        --config.init_from=gs://bucket/bert_base/phase1/checkpoints ...

(`:phase1_tokens` in place of `:phase1` for the token-matched phase 1 below; phase 2 is the same.)

Recipe (A.2): Adam, lr 1e-4, b1 0.9, b2 0.999, weight decay 0.01, 10k warmup steps then linear decay;
dropout 0.1; "batch size of 256 sequences (256 sequences * 512 tokens = 128,000 tokens/batch) for
1,000,000 steps", of which the first 90% at sequence length 128 and the last 10% at 512 "to learn the
positional embeddings". What the paper states is 256 sequences, so `:phase1` is 256 * 128 (32k tokens
per batch) and `:phase2` 256 * 512. `:phase1_tokens` is an interpretation, not the paper's statement:
1024 * 128, the 128k tokens per batch that the paper quotes for 512-token sequences, kept at length 128
(equal tokens per step for the whole 1M-step schedule). 20 predictions per 128-token sequence and 80
per 512 (google-research/bert README). The optimizer omits Adam's bias correction as the original
AdamWeightDecayOptimizer does, and the GELU is the original code's tanh approximation (`gelu` in its
modeling.py). BERT-base was trained on "4 Cloud TPUs in Pod configuration (16 TPU chips total)", hence
`topology = "v3:4x4"`.

Phase 2 restores phase 1's full final state (parameters, Adam moments, step 900k) and continues the one
1M-step schedule; the data iterator starts fresh, since the sequence length changes.

The meshes (data x fsdp x tensor over v3:4x4's 32 cores, `MESHES`) are those `bert-jax aot --search_mesh`
ranked first (docs/performance.md, "BERT-base on v3:4x4"): with 8 sequences per core, sharding the
parameters and Adam moments over every core moves the fewest bytes (phase 1: MFU bound 82% against 53%
data-parallel; 86% with each weight gathered once a step, `model.reshard_after_forward` False). On other
hardware set `--config.mesh.*` (or search it: `bert-jax aot --search_mesh --topology=...`).
"""

from bert_jax import tpu_chips
from configs import common

TOTAL_STEPS = 1_000_000
PHASE1_STEPS = 900_000         # 90% at seq 128 (A.2)
SEQUENCES_PER_BATCH = 256      # "batch size of 256 sequences" (A.2)
TOKENS_PER_BATCH = 256 * 512   # "256 sequences * 512 tokens = 128,000 tokens/batch" (A.2)
PHASES = ("phase1", "phase1_tokens", "phase2")
# phase -> (data, fsdp, tensor) on v3:4x4, the search's first among all 11 splits (phase 1), 6 (phase 2,
# compute-bound from 16 x 2 x 1 on: 1 x 32 x 1 first by 0.002 ms of XLA's FLOPs, 2 x 16 x 1 as good) and 4
# (phase1_tokens); data -1 takes what is left of the devices.
MESHES = {"phase1": (-1, 32, 1), "phase1_tokens": (-1, 32, 1), "phase2": (-1, 32, 1)}
# Phases whose layers are scanned (one compiled layer body): where the step is compute-bound either way, so
# the scanned step's extra bytes cost no step time by the estimate. phase1_tokens on v3:4x4: memory 32.7 ms
# (14.7 GB by op) scanned against 27.5 ms (12.4 GB) unrolled, under compute 36.4 to 38.4 ms; compiled in
# 24.9 s against 68.7 s on a 2-core CPU. Phase 1 is memory-bound and phase 2 nearly so (memory 39.5 against
# compute 44.1 ms unrolled): unrolled (docs/performance.md, "Scanned or unrolled layers").
SCANNED_PHASES = ("phase1_tokens",)


def get_config(arg: str = "phase1", preset: str = "base"):
  """`arg` is "phase1" (256 x 128, as A.2 states), "phase1_tokens" (1024 x 128, token-matched to
  phase 2) or "phase2" (256 x 512)."""
  if arg not in PHASES:
    raise ValueError(f"unknown phase {arg!r}: use one of {PHASES}")
  c = common.pretrain_config()
  c.model.preset = preset
  # The GELU of google-research/bert's modeling.py, which pretrained the released checkpoints: the tanh
  # approximation (its `gelu`; Hugging Face's "gelu_new"). Hugging Face's port runs those checkpoints
  # with the exact erf form, which loading one takes from its config.json.
  c.model.hidden_act = "gelu_new"
  c.optimizer.learning_rate = 1e-4
  c.optimizer.warmup_steps = 10_000
  c.optimizer.total_steps = TOTAL_STEPS
  c.optimizer.bias_correction = False
  if arg == "phase2":
    c.data.seq_length, c.data.max_predictions_per_seq = 512, 80
    c.train_steps = TOTAL_STEPS
    c.init_from = "PHASE1_WORKDIR/checkpoints"   # set with --config.init_from=...
  else:
    c.data.seq_length, c.data.max_predictions_per_seq = 128, 20
    c.train_steps = PHASE1_STEPS
  c.global_batch_size = TOKENS_PER_BATCH // c.data.seq_length if arg == "phase1_tokens" else SEQUENCES_PER_BATCH
  c.topology = "v3:4x4"       # 16 chips (A.2)
  c.peak_flops_per_device = tpu_chips.peak_flops_per_device(c.topology)   # for MFU
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = MESHES[arg]
  c.model.scan_layers = arg in SCANNED_PHASES
  # Dropout's bits from a counter hash of each element's index (models/dropout.py), as bert_large.py's v3
  # steps: XLA counts fewer FLOPs than threefry's and the same bytes (v3:4x4 phase 2 compute-bound, MFU bound
  # 89% -> 95%, compiled in 104.9 -> 70.9 s; phase 1 95% -> 96%, 53.7 -> 41.2 s; docs/performance.md).
  c.model.dropout_bits = "hash"
  # Each weight all-gathered once a step, kept for the backward pass (models/fsdp_gather.py): on v3 fewer
  # bytes in every phase (phase 1 MFU bound 82% -> 86%) for 0.06 to 0.14 GiB a core (docs/performance.md).
  c.model.reshard_after_forward = False
  return c

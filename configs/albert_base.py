"""ALBERT-base pretraining as in Lan et al. 2019 (arXiv:1909.11942), 4.1 and Table 1.

    bert-jax pretrain --config=configs/albert_base.py --workdir=gs://bucket/albert_base \
        --config.data.train_files=gs://bucket/prepared/train --config.data.vocab_file=gs://bucket/spiece.model

Recipe (4.1): "All the model updates use a batch size of 4096 and a LAMB optimizer with learning rate
0.00176. We train all models for 125,000 steps"; inputs of up to 512 tokens, shorter with probability
10%; a 30,000-token SentencePiece vocabulary; n-gram masking with n <= 3, p(n) ~ 1/n; sentence-order
prediction. Table 1 sizes (embedding size E = 128 for all): base 12 x 768 (12 heads), large 24 x 1024
(16), xlarge 24 x 2048 (16), xxlarge 12 x 4096 (64), feed-forward 4H, all layers sharing one set of
parameters (3). Dropout 0 and gelu_new as the released v2 `albert_config.json` files; 3,125 warmup steps
and 20 predictions per sequence as google-research/albert's run_pretraining README. Its LAMB
(`lamb_optimizer.py`) has no Adam bias correction and leaves LayerNorm and biases out of both the weight
decay and the trust ratio, as `optimizer.py` does for every LAMB. "The number of TPUs
used for training ranged from 64 to 512" (4.1): v3:8x8 (64 chips) here, larger sizes on more.
"""

from bert_jax import tpu_chips
from configs import common

BATCH, STEPS, LEARNING_RATE, WARMUP = 4096, 125_000, 0.00176, 3_125
# size -> (layers, hidden, heads); E = 128, intermediate 4H (Table 1).
SIZES = {"base": (12, 768, 12), "large": (24, 1024, 16), "xlarge": (24, 2048, 16), "xxlarge": (12, 4096, 64)}
# size -> gradient-accumulation micro-batches on v3:8x8 (32 rows of 512 tokens per 16 GiB core): in one
# pass the step's temporaries alone need 7.6 / 20 / 28 / 43 GiB (`bert-jax aot`, docs/objectives.md).
MICRO_BATCHES = {"base": 1, "large": 2, "xlarge": 4, "xxlarge": 8}


def get_config(arg: str = "", size: str = "base"):
  """`arg` is unused (one phase); kept for the `:arg` convention."""
  del arg
  layers, hidden, heads = SIZES[size]
  c = common.pretrain_config()
  c.objective = "albert"
  c.model.preset = f"L-{layers}_H-{hidden}_A-{heads}"
  c.model.embedding_size = 128
  c.model.share_layers = True
  c.model.vocab_size = 30_000
  c.model.hidden_act = "gelu_new"
  c.model.hidden_dropout = c.model.attention_dropout = 0.0
  c.data.format = "sop"
  c.data.ngram_masking = True
  c.data.seq_length, c.data.max_predictions_per_seq = 512, 20
  c.data.short_seq_prob = 0.1
  c.data.do_lower_case = True
  c.global_batch_size = BATCH
  c.train_steps = STEPS
  c.optimizer.name = "lamb"
  c.optimizer.learning_rate = LEARNING_RATE
  c.optimizer.warmup_steps = WARMUP
  c.optimizer.total_steps = STEPS
  c.optimizer.eps = 1e-6
  c.optimizer.bias_correction = False   # google-research/albert's lamb_optimizer.py
  c.topology = "v3:8x8"
  c.peak_flops_per_device = tpu_chips.peak_flops_per_device(c.topology)   # for MFU
  c.mesh.data, c.mesh.fsdp = -1, 1
  c.micro_batches = MICRO_BATCHES[size]
  return c

"""RoBERTa-base pretraining as in Liu et al. 2019 (arXiv:1907.11692), Table 9.

    bert-jax pretrain --config=configs/roberta_base.py --workdir=gs://bucket/roberta_base \
        --config.data.train_files=gs://bucket/prepared/train
    (`bert-jax prepare --vocab_model=byte_bpe` trains the byte-level BPE beside the shards.)

Table 9 (base): peak lr 6e-4, 24k warmup steps, batch 8k sequences of 512 tokens, 500k steps, Adam
b1 0.9, b2 0.98, eps 1e-6, weight decay 0.01, dropout 0.1, no gradient clipping, linear decay. No NSP,
FULL-SENTENCES inputs (4.2), full-length sequences only (3.1: "we do not randomly inject short
sequences"), dynamic masking (4.1, which our input pipeline always does). A 50k byte-level
BPE vocabulary (4.4), one token type, and fairseq's positions: 514 of them, counted from pad id 1 + 1.
"""

from bert_jax import tpu_chips
from configs import common

BATCH = 8192
STEPS = 500_000


def get_config(arg: str = "", preset: str = "base"):
  """`arg` is unused (one phase); kept for the `:arg` convention."""
  del arg
  c = common.pretrain_config()
  c.model.preset = preset
  c.objective = "roberta"
  c.model.vocab_size = 50_265
  c.model.type_vocab_size = 1
  c.model.max_position_embeddings = 514
  c.model.position_pad_id = 1
  c.model.layer_norm_eps = 1e-5
  c.data.format = "full_sentences"
  c.data.short_seq_prob = 0.0   # 3.1: no short sequences injected
  c.data.seq_length, c.data.max_predictions_per_seq = 512, 80
  c.global_batch_size = BATCH
  c.train_steps = STEPS
  c.optimizer.learning_rate = 6e-4
  c.optimizer.warmup_steps = 24_000
  c.optimizer.total_steps = STEPS
  c.optimizer.b2 = 0.98
  c.optimizer.clip_norm = 0.0
  c.optimizer.bias_correction = True   # fairseq's Adam
  c.topology = "v3:8x8"
  c.peak_flops_per_device = tpu_chips.peak_flops_per_device(c.topology)   # for MFU
  c.mesh.data, c.mesh.fsdp = -1, 8
  c.micro_batches = 8
  return c

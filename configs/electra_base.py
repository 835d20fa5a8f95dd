"""ELECTRA-Base pretraining as in Clark et al. 2020 (arXiv:2003.10555), appendix A, Table 6.

    bert-jax pretrain --config=configs/electra_base.py --workdir=gs://bucket/electra_base \
        --config.data.train_files=gs://bucket/prepared/train --config.data.vocab_file=gs://bucket/vocab.txt

Table 6: small 12 x 256 (4 heads, FFN 1024, embeddings 128), base 12 x 768 (12, 3072, 768), large 24 x 1024
(16, 4096, 1024); the generator scales hidden size, FFN and heads by 1/4, 1/3, 1/4; mask 15% (25% for
large); Adam b1 0.9, b2 0.999, eps 1e-6, weight decay 0.01, 10k warmup steps then linear decay, lr 5e-4,
2e-4, 2e-4; dropout 0.1; batch 128, 256, 2048 for 1M, 766k, 400k steps. Sequences of 128 tokens for
small, 512 otherwise (3.2); BERT's uncased 30,522-token vocabulary; no NSP. Predictions per sequence
and 85% [MASK] / 15% kept (no random tokens) as the released electra `pretrain_helpers.mask`.
"""

from configs import common

# size -> (layers, hidden, heads, embedding size, generator fraction, mask rate, lr, batch, steps, length)
SIZES = {
    "small": (12, 256, 4, 128, 1 / 4, 0.15, 5e-4, 128, 1_000_000, 128),
    "base": (12, 768, 12, 768, 1 / 3, 0.15, 2e-4, 256, 766_000, 512),
    "large": (24, 1024, 16, 1024, 1 / 4, 0.25, 2e-4, 2048, 400_000, 512),
}


def get_config(arg: str = "", size: str = "base"):
  """`arg` is unused (one phase); kept for the `:arg` convention."""
  del arg
  layers, hidden, heads, embedding, fraction, mask_rate, lr, batch, steps, length = SIZES[size]
  c = common.pretrain_config()
  c.objective = "electra"
  c.model.preset = f"L-{layers}_H-{hidden}_A-{heads}"
  if embedding != hidden:
    c.model.embedding_size = embedding
  with c.unlocked():
    c.generator_hidden_fraction = fraction   # bert_jax/objectives/electra.py
  c.data.format = "full_sentences"
  c.data.do_lower_case = True
  c.data.masked_lm_prob = mask_rate
  c.data.seq_length, c.data.max_predictions_per_seq = length, int((mask_rate + 0.005) * length)
  c.data.mask_token_prob, c.data.random_token_prob = 0.85, 0.0
  c.global_batch_size = batch
  c.train_steps = steps
  c.optimizer.learning_rate = lr
  c.optimizer.warmup_steps = 10_000
  c.optimizer.total_steps = steps
  c.topology = "v3:8x8"
  c.peak_flops_per_device = 61.5e12
  c.mesh.data, c.mesh.fsdp = -1, 1 if size == "small" else 8
  return c

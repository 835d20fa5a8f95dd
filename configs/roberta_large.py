"""RoBERTa-large pretraining as in Liu et al. 2019 (arXiv:1907.11692), Table 9.

    bert-jax pretrain --config=configs/roberta_large.py --workdir=gs://bucket/roberta_large \
        --config.data.train_files=gs://bucket/prepared/train

Same as `roberta_base.py` except Table 9 (large): peak lr 4e-4 and 30k warmup steps.
"""

from configs import roberta_base


def get_config(arg: str = ""):
  c = roberta_base.get_config(arg, preset="large")
  c.optimizer.learning_rate = 4e-4
  c.optimizer.warmup_steps = 30_000
  c.micro_batches = 16
  return c

"""SNLI (Bowman et al. 2015), 3-way entailment; accuracy on dev. Pairs without a consensus label ("-") are
skipped, as in the paper's figures (its release's `snli_1.0_{train,dev}.jsonl` or `.txt`, or TFDS `snli`):

  bert-jax finetune --config=configs/finetune/snli.py --workdir=runs/snli \
      --config.init_checkpoint=/path/to/bert --config.data_dir=/path/to/snli_1.0
"""

from configs.finetune import common


def get_config():
  c = common.get_config()
  c.task = "snli"
  return c

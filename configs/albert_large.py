"""ALBERT-large pretraining as in Lan et al. 2019, Table 1 and 4.1: `albert_base.py` at the large size.

    bert-jax pretrain --config=configs/albert_large.py --workdir=gs://bucket/albert_large ...
"""

from configs import albert_base


def get_config(arg: str = ""):
  return albert_base.get_config(arg, size="large")

"""ALBERT-xxlarge pretraining as in Lan et al. 2019, Table 1 and 4.1: `albert_base.py` at the xxlarge size.

    bert-jax pretrain --config=configs/albert_xxlarge.py --workdir=gs://bucket/albert_xxlarge ...
"""

from configs import albert_base


def get_config(arg: str = ""):
  return albert_base.get_config(arg, size="xxlarge")

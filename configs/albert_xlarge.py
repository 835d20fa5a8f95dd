"""ALBERT-xlarge pretraining as in Lan et al. 2019, Table 1 and 4.1: `albert_base.py` at the xlarge size.

    bert-jax pretrain --config=configs/albert_xlarge.py --workdir=gs://bucket/albert_xlarge ...
"""

from configs import albert_base


def get_config(arg: str = ""):
  return albert_base.get_config(arg, size="xlarge")

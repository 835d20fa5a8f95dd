"""ELECTRA-Small pretraining (Clark et al. 2020, Table 6): `electra_base.py` at the small size.

    bert-jax pretrain --config=configs/electra_small.py --workdir=gs://bucket/electra_small ...
"""

from configs import electra_base


def get_config(arg: str = ""):
  return electra_base.get_config(arg, size="small")

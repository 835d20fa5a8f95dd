"""ELECTRA-Large pretraining (Clark et al. 2020, Table 6): `electra_base.py` at the large size.

    bert-jax pretrain --config=configs/electra_large.py --workdir=gs://bucket/electra_large ...
"""

from configs import electra_base


def get_config(arg: str = ""):
  return electra_base.get_config(arg, size="large")

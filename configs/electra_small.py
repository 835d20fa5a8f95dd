"""ELECTRA-Small pretraining (Clark et al. 2020, Table 6): `electra_base.py` at the small size.

    bert-jax pretrain --config=configs/electra_small.py --workdir=gs://bucket/electra_small ...

The release's defaults (github.com/google-research/electra, configure_pretraining.py) are this size:
12 x 256, 4 heads, FFN 1024 (util/training_utils.py:102-110), embeddings 128 (:118-119), generator 1/4
(:75), mask 15% (:40), 19 predictions per 128 tokens (:82, :106-107), lr 5e-4 (:43), batch 128 (:83),
1M steps (:51), 10k warmup (:46), weight decay 0.01 (:45). The discriminator ("bert" + "discriminator")
has 13,549,057 parameters, as transformers' `ElectraForPreTraining` at this size.
"""

from configs import electra_base


def get_config(arg: str = ""):
  return electra_base.get_config(arg, size="small")

"""ELECTRA-Large pretraining (Clark et al. 2020, Table 6): `electra_base.py` at the large size.

    bert-jax pretrain --config=configs/electra_large.py --workdir=gs://bucket/electra_large ...

From the release's commented-out large block (github.com/google-research/electra,
configure_pretraining.py:122-132): 512 tokens (:123), lr 2e-4 (:124), embeddings 1024 (:130), mask 25%
(:131) hence 130 predictions per sequence (:106-107), batch 2048 (:132); 24 x 1024 (util/
training_utils.py:98-99), 16 heads and FFN 4096 (:109-110); generator 1/4 (:75); 400k steps (Table 6).
The discriminator ("bert" + "discriminator") has 335,142,913 parameters, as transformers'
`ElectraForPreTraining` at this size.
"""

from configs import electra_base


def get_config(arg: str = ""):
  return electra_base.get_config(arg, size="large")

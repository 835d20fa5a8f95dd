"""SpanBERT-large pretraining (Joshi et al. 2020): `spanbert_base.py` at BERT-large's size.

    bert-jax pretrain --config=configs/spanbert_large.py --workdir=gs://bucket/spanbert_large ...
"""

from configs import spanbert_base


def get_config(arg: str = ""):
  c = spanbert_base.get_config(arg, preset="large")
  c.mesh.fsdp = 8
  return c

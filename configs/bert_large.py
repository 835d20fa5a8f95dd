"""BERT-large pretraining as in Devlin et al. 2019 (arXiv:1810.04805), Appendix A.2.

    bert-jax pretrain --config=configs/bert_large.py:phase1 --workdir=gs://bucket/bert_large/phase1 \
        --config.data.train_files=gs://bucket/prepared/train --config.data.vocab_file=gs://bucket/vocab.txt
    bert-jax pretrain --config=configs/bert_large.py:phase2 --workdir=gs://bucket/bert_large/phase2 \
        --config.init_from=gs://bucket/bert_large/phase1/checkpoints ...
    bert-jax aot --config=configs/bert_large.py:phase2 --topology=v3:8x8   # check it fits first

Same recipe as `bert_base.py` (see there: 1M steps, 90% at seq 128 then 10% at 512, batches of 256
sequences, or 1024 at seq 128 with `:phase1_tokens`, lr 1e-4, 10k warmup, linear decay); only the model
and the hardware differ: BERT-large was trained on "16 Cloud TPUs (64 TPU chips total)" (A.2), hence
`topology = "v3:8x8"`. The 4-way fsdp axis shards parameters and Adam moments so that the seq-512
phase keeps headroom on a 16 GB v3 core.
"""

from configs import bert_base


def get_config(arg: str = "phase1"):
  """`arg` is "phase1" (256 x 128), "phase1_tokens" (1024 x 128) or "phase2" (256 x 512), as in bert_base."""
  c = bert_base.get_config(arg, preset="large")
  c.topology = "v3:8x8"       # 64 chips (A.2)
  c.mesh.data, c.mesh.fsdp = -1, 4
  return c

"""BERT-large pretraining as in Devlin et al. 2019 (arXiv:1810.04805), Appendix A.2.

    bert-jax pretrain --config=configs/bert_large.py:phase1 --workdir=gs://bucket/bert_large/phase1 \
        --config.data.train_files=gs://bucket/prepared/train --config.data.vocab_file=gs://bucket/vocab.txt
    bert-jax pretrain --config=configs/bert_large.py:phase2 --workdir=gs://bucket/bert_large/phase2 \
        --config.init_from=gs://bucket/bert_large/phase1/checkpoints ...
    bert-jax aot --config=configs/bert_large.py:phase2 --topology=v3:8x8   # check it fits first

Same recipe as `bert_base.py` (see there: 1M steps, 90% at seq 128 then 10% at 512, batches of 256
sequences, or 1024 at seq 128 with `:phase1_tokens`, lr 1e-4, 10k warmup, linear decay); only the model
and the hardware differ: BERT-large was trained on "16 Cloud TPUs (64 TPU chips total)" (A.2), hence
`topology = "v3:8x8"`.

The meshes (data x fsdp x tensor over v3:8x8's 128 cores) are those `bert-jax aot --search_mesh` ranked
first (docs/performance.md): phase 1 1 x 64 x 2 among 32x4x1 (the earlier choice), 8x16x1, 2x64x1,
1x128x1 and 1x64x2; phase 2 2 x 64 x 1 among 32x4x1, 2x64x1 and 1x64x2. With 2 sequences per core the
bytes of parameters and Adam moments dominate the step: sharding them 64 ways (fsdp), and at seq 128
each matrix 2 ways too (tensor; BERT's 30,522-word vocabulary allows no more), moves the fewest.
`phase1_tokens` (4x the rows) keeps phase 1's mesh unsearched. On another topology, search again
(`mesh.data` = -1 takes what is left of more cores). Attention stays on the explicit path;
`--config.model.attention_kernel=flash` runs it, dropout included, as one Pallas kernel: `aot` estimates
it faster on v3, and its compiled schedule puts the kernel's own cost well above that estimate
(docs/performance.md).
"""

from configs import bert_base


def get_config(arg: str = "phase1"):
  """`arg` is "phase1" (256 x 128), "phase1_tokens" (1024 x 128) or "phase2" (256 x 512), as in bert_base."""
  c = bert_base.get_config(arg, preset="large")
  c.topology = "v3:8x8"       # 64 chips (A.2)
  # aot --search_mesh for v3:8x8 (docstring)
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = (-1, 64, 1) if arg == "phase2" else (-1, 64, 2)
  return c

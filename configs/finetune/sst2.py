"""GLUE SST-2 (Socher et al. 2013), sentiment, accuracy.

Devlin et al. 2019, Sec. 4.1 (GLUE) and Appendix A.3 (the grid in `common.sweep_config`):

  bert-jax finetune --config=configs/finetune/sst2.py --workdir=/tmp/sst2 \
      --config.init_checkpoint=/path/to/bert --config.data_dir=/path/to/glue/SST2
  bert-jax sweep --config=configs/finetune/sst2.py --workdir=/tmp/sst2_sweep --config.init_checkpoint=...

Measured: MiniLM-L6-H384 (Hugging Face directory) on rotten_tomatoes (SST-2 format), 4000 training
sentences, one epoch (125 steps), sequences of 64, lr 1e-4: dev accuracy 0.807 on all 1000 dev
sentences, 871 s wall time on a busy 2-core CPU (0.795 after 63 steps):

  bert-jax finetune --config=configs/finetune/sst2.py --workdir=/tmp/rt \
      --config.init_checkpoint=../shared/data/minilm --config.data_dir=../shared/data/tasks/rotten_tomatoes \
      --config.max_seq_length=64 --config.max_train_examples=4000 --config.num_epochs=1 \
      --config.learning_rate=1e-4 --config.eval_every_steps=63
"""

from configs.finetune import common


def get_config():
  c = common.get_config()
  c.task = "sst2"
  return c

"""GLUE SST-2 (Socher et al. 2013), sentiment, accuracy.

Devlin et al. 2019, Sec. 4.1 (GLUE) and Appendix A.3 (the grid in `common.sweep_config`):

  bert-jax finetune --config=configs/finetune/sst2.py --workdir=/tmp/sst2 \
      --config.init_checkpoint=/path/to/bert --config.data_dir=/path/to/glue/SST2
  bert-jax sweep --config=configs/finetune/sst2.py --workdir=/tmp/sst2_sweep --config.init_checkpoint=...
"""

from configs.finetune import common


def get_config():
  c = common.get_config()
  c.task = "sst2"
  return c

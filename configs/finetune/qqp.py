"""GLUE QQP, Quora question pairs, F1 and accuracy.

Devlin et al. 2019, Sec. 4.1 (GLUE) and Appendix A.3 (the grid in `common.sweep_config`):

  bert-jax finetune --config=configs/finetune/qqp.py --workdir=/tmp/qqp \
      --config.init_checkpoint=/path/to/bert --config.data_dir=/path/to/glue/QQP
  bert-jax sweep --config=configs/finetune/qqp.py --workdir=/tmp/qqp_sweep --config.init_checkpoint=...
"""

from configs.finetune import common


def get_config():
  c = common.get_config()
  c.task = "qqp"
  return c

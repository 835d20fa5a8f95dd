"""GLUE STS-B (Cer et al. 2017): sentence-pair similarity in [0, 5], a regression head (one output,
squared error); Pearson and Spearman correlation.

Devlin et al. 2019, Sec. 4.1 and Appendix A.3 (grid in `common.sweep_config`):

  bert-jax finetune --config=configs/finetune/stsb.py --workdir=/tmp/stsb \
      --config.init_checkpoint=/path/to/bert --config.data_dir=/path/to/glue/STS-B
"""

from configs.finetune import common


def get_config():
  c = common.get_config()
  c.task = "stsb"
  return c

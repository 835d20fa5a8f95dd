"""GLUE QNLI, question-answering NLI from SQuAD, accuracy.

Devlin et al. 2019, Sec. 4.1 (GLUE) and Appendix A.3 (the grid in `common.sweep_config`):

  bert-jax finetune --config=configs/finetune/qnli.py --workdir=/tmp/qnli \
      --config.init_checkpoint=/path/to/bert --config.data_dir=/path/to/glue/QNLI
  bert-jax sweep --config=configs/finetune/qnli.py --workdir=/tmp/qnli_sweep --config.init_checkpoint=...
"""

from configs.finetune import common


def get_config():
  c = common.get_config()
  c.task = "qnli"
  return c

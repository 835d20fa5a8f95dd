"""GLUE MRPC (Dolan and Brockett 2005), paraphrase, F1 and accuracy.

Devlin et al. 2019, Sec. 4.1 (GLUE) and Appendix A.3 (the grid in `common.sweep_config`):

  bert-jax finetune --config=configs/finetune/mrpc.py --workdir=/tmp/mrpc \
      --config.init_checkpoint=/path/to/bert --config.data_dir=/path/to/glue/MRPC
  bert-jax sweep --config=configs/finetune/mrpc.py --workdir=/tmp/mrpc_sweep --config.init_checkpoint=...
"""

from configs.finetune import common


def get_config():
  c = common.get_config()
  c.task = "mrpc"
  return c

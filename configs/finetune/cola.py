"""GLUE CoLA (Warstadt et al. 2019), acceptability, Matthews correlation.

Devlin et al. 2019, Sec. 4.1 (GLUE) and Appendix A.3 (the grid in `common.sweep_config`):

  bert-jax finetune --config=configs/finetune/cola.py --workdir=/tmp/cola \
      --config.init_checkpoint=/path/to/bert --config.data_dir=/path/to/glue/COLA
  bert-jax sweep --config=configs/finetune/cola.py --workdir=/tmp/cola_sweep --config.init_checkpoint=...
"""

from configs.finetune import common


def get_config():
  c = common.get_config()
  c.task = "cola"
  return c

"""GLUE WNLI (Levesque et al. 2012 as NLI), accuracy.

Devlin et al. 2019, Sec. 4.1, footnote 12: the dev set is adversarial and every submitted system did
worse than predicting the majority class (65.1); the paper excludes WNLI. The config exists so the
benchmark can be run end to end:

  bert-jax finetune --config=configs/finetune/wnli.py --workdir=/tmp/wnli \
      --config.init_checkpoint=/path/to/bert --config.data_dir=/path/to/glue/WNLI
"""

from configs.finetune import common


def get_config():
  c = common.get_config()
  c.task = "wnli"
  return c

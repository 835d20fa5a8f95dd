"""GLUE MNLI (Williams et al. 2018), 3-way entailment; accuracy on dev matched and mismatched.

Devlin et al. 2019, Sec. 4.1 and Appendix A.3 (grid in `common.sweep_config`). The large training set
(393k pairs) makes the result insensitive to the grid (A.3), so one run with the default values suffices:

  bert-jax finetune --config=configs/finetune/mnli.py --workdir=/tmp/mnli \
      --config.init_checkpoint=/path/to/bert --config.data_dir=/path/to/glue/MNLI
"""

from configs.finetune import common


def get_config():
  c = common.get_config()
  c.task = "mnli"
  c.eval_split = "dev_matched"
  return c

"""Any single-sentence or sentence-pair classification or regression task from TSV, CSV or JSON lines
files with named columns (train.* and dev.* in `data_dir`). Grid of Devlin et al. 2019, A.3.

  bert-jax finetune --config=configs/finetune/generic.py --workdir=/tmp/paws \
      --config.init_checkpoint=/path/to/bert --config.data_dir=/path/to/data \
      --config.task_opts.text_a=sentence1 --config.task_opts.text_b=sentence2 \
      --config.task_opts.label=label --config.task_opts.num_labels=2

`num_labels=1` is regression. Variants: `generic.py:single` (no text_b), `generic.py:pair`.
"""

from configs.finetune import common


def get_config(arg: str = "single"):
  c = common.get_config()
  c.task = "generic"
  c.task_opts.text_a = "sentence"
  c.task_opts.text_b = "" if arg == "single" else "sentence2"
  c.task_opts.label = "label"
  c.task_opts.num_labels = 2
  if arg == "pair":
    c.task_opts.text_a = "sentence1"
  elif arg != "single":
    raise ValueError(f"unknown variant {arg!r}; use 'single' or 'pair'")
  return c

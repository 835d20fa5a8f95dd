"""CoNLL-2003 NER (Tjong Kim Sang and De Meulder 2003): entity-level F1; the first sub-token of each word
carries the label (Devlin et al. 2019, Sec. 5.3, cased model, no CRF).

Finetuning (grid of A.3):

  bert-jax finetune --config=configs/finetune/conll2003.py --workdir=/tmp/ner \
      --config.init_checkpoint=/path/to/bert-cased --config.data_dir=/path/to/conll2003

Feature-based (Sec. 5.3, Table 7: a learned mix of layers instead of finetuning; the paper's best is
the concatenation of the last four layers feeding a BiLSTM, here a scalar mix feeding the classifier):

  bert-jax finetune --config=configs/finetune/conll2003.py:feature_based ...
"""

from configs.finetune import common


def get_config(arg: str = ""):
  c = common.get_config()
  c.task = "conll2003"
  c.do_lower_case = False
  c.num_epochs = 4
  if arg == "feature_based":
    c.scalar_mix = True
    c.freeze_encoder = True
    c.learning_rate = 1e-3  # only the mix and the classifier train
    c.sweep.grid.learning_rate = (3e-3, 1e-3, 3e-4)
  elif arg:
    raise ValueError(f"unknown variant {arg!r}; use '' or 'feature_based'")
  return c

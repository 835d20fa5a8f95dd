"""Liu et al. 2019 (RoBERTa), Table 1: static against dynamic masking (BERT-base, dev sets).

    bert-jax ablate --config=configs/ablations/roberta_table1.py:small --workdir=runs/ablate/roberta_table1 \
        --config.base.data.train_files=prepared/news \
        --config.tasks.sst2.data_dir=../shared/data/tasks/rotten_tomatoes

Variants (4.1): *static*, BERT's preprocessing, "the training data was duplicated 10 times so that each
sequence is masked in 10 different ways over the 40 epochs of training", so every mask is seen 4 times
(`data.dupe_factor = 10`: epoch e trains on copy e % 10, its instances and masks fixed); *dynamic*, a new
mask every time a sequence is fed (`data.dupe_factor = 0`, our default). Both are the reimplemented BERT
(SEGMENT-PAIR + NSP, the `nsp` format). Budget: the same steps and batch.

At the CPU scales a run covers about 3 epochs of the news corpus (2,000 steps of 64 x 64 tokens against its
2.8M training tokens), so static masking with 10 copies would never repeat a mask; there the static variant
has one copy (`dupe_factor = 1`): each mask is seen about 3 times, as the paper's 4.

`:paper` is BERT-base on full-length sequences (configs/bert_base.py's model and optimizer, 256 x 512
tokens for 1M steps, from scratch).

The numbers below were checked against Table 1 of arXiv:1907.11692 (a text transcription of its Section 4).
"""

from configs.ablations import common
from configs.ablations import roberta_table2

# Liu et al. 2019, Table 1: SQuAD 2.0 F1, MNLI-m and SST-2 accuracy (dev; medians over 5 seeds).
PAPER = {k: v for k, v in roberta_table2.TABLE1.items() if k != "reference"}
COLUMNS = {"mnli": "mnli_m", "sst2": "sst2"}
PAPER_DUPE_FACTOR, CPU_DUPE_FACTOR = 10, 1


def get_config(arg: str = "small"):
  scale = common.check_scale(arg)
  base = roberta_table2.paper_base() if scale == "paper" else common.cpu_base(scale)
  base.data.format = "nsp"
  static = PAPER_DUPE_FACTOR if scale == "paper" else CPU_DUPE_FACTOR
  variants = [
      common.variant("static", f"static (dupe_factor {static})", {"data.dupe_factor": static}, PAPER["static"]),
      common.variant("dynamic", "dynamic", {"data.dupe_factor": 0}, PAPER["dynamic"]),
  ]
  return common.ablation(
      "roberta_table1", "Liu et al. 2019 (RoBERTa), Table 1: static vs dynamic masking", base, variants,
      common.tasks(scale, ("mnli", "sst2")), budget="tokens",
      budget_description="same tokens: both variants train the base's steps x batch x sequence length",
      paper_source="Liu et al. 2019, Table 1 (BERT-base, BookCorpus + Wikipedia; dev MNLI-m and SST-2 accuracy, "
                   "medians over 5 finetuning seeds)",
      columns=COLUMNS)

"""Liu et al. 2019 (RoBERTa), Table 2: input format and next sentence prediction (BERT-base size, dev sets).

    bert-jax ablate --config=configs/ablations/roberta_table2.py:small --workdir=runs/ablate/roberta_table2 \
        --config.base.data.train_files=prepared/news \
        --config.tasks.sst2.data_dir=../shared/data/tasks/rotten_tomatoes

Variants, from the `data.format` values the pipeline has (bert_jax/data/instances.py): SEGMENT-PAIR + NSP
(`nsp`: pairs of multi-sentence segments, BERT's format), SENTENCE-PAIR + NSP (`sentence_pair`: pairs
of single natural sentences, the next one or one of another document), FULL-SENTENCES
(`full_sentences`, crossing documents) and DOC-SENTENCES (`doc_sentences`), the last two MLM only
(objective roberta). Budget: the same steps and batch of rows for every variant. Left out: the
paper's larger batches for the short rows of SENTENCE-PAIR (4.2: "we increase the batch size so that
the total number of tokens remains similar to SEGMENT-PAIR") and of DOC-SENTENCES (to match
FULL-SENTENCES): here those variants train on fewer real tokens, the rest of each row being padding.

Table 1 of the same paper (static against dynamic masking) is `roberta_table1.py`.

`:paper` is BERT-base trained on full-length sequences (3.1: T = 512): configs/bert_base.py's model and
optimizer, 256 x 512 tokens for 1M steps, from scratch (Table 2's caption: 1M steps of 256 sequences).

The numbers below were checked against Tables 1 and 2 of arXiv:1907.11692 (a text transcription of its
Section 4), with their column names and 4.2's description of the formats.
"""

from configs import bert_base
from configs.ablations import common

# Liu et al. 2019, Table 2: SQuAD 1.1 / 2.0 F1, MNLI-m, SST-2, RACE accuracy (dev; medians over 5 seeds).
# Checked against arXiv:1907.11692, Table 2.
PAPER = {
    "segment_pair_nsp": {"squad11_f1": 90.4, "squad20_f1": 78.7, "mnli_m": 84.0, "sst2": 92.9, "race": 64.2},
    "sentence_pair_nsp": {"squad11_f1": 88.7, "squad20_f1": 76.2, "mnli_m": 82.9, "sst2": 92.1, "race": 63.0},
    "full_sentences": {"squad11_f1": 90.4, "squad20_f1": 79.1, "mnli_m": 84.7, "sst2": 92.5, "race": 64.8},
    "doc_sentences": {"squad11_f1": 90.6, "squad20_f1": 79.7, "mnli_m": 84.7, "sst2": 92.7, "race": 65.6},
}
COLUMNS = {"mnli": "mnli_m", "sst2": "sst2"}
# Liu et al. 2019, Table 1 (BERT-base, dev; SQuAD 2.0 F1, MNLI-m and SST-2 accuracy, medians over 5 seeds):
# static against dynamic masking, and the published BERT-base ("reference", from Yang et al. 2019). Checked
# against arXiv:1907.11692, Table 1; run by roberta_table1.py.
TABLE1 = {
    "reference": {"squad20_f1": 76.3, "mnli_m": 84.3, "sst2": 92.8},
    "static": {"squad20_f1": 78.3, "mnli_m": 84.3, "sst2": 92.5},
    "dynamic": {"squad20_f1": 78.7, "mnli_m": 84.0, "sst2": 92.9},
}


def paper_base():
  c = bert_base.get_config("phase2")
  c.model.hidden_act = "gelu"   # the exact GELU of FAIRSEQ, where the paper's BERT-base was trained
  c.init_from = ""
  c.train_steps = c.optimizer.total_steps = 1_000_000
  return c


def get_config(arg: str = "small"):
  scale = common.check_scale(arg)
  base = paper_base() if scale == "paper" else common.cpu_base(scale)
  variants = [
      common.variant("segment_pair_nsp", "SEGMENT-PAIR + NSP", {"data.format": "nsp"}, PAPER["segment_pair_nsp"]),
      common.variant("sentence_pair_nsp", "SENTENCE-PAIR + NSP", {"data.format": "sentence_pair"},
                     PAPER["sentence_pair_nsp"]),
      common.variant("full_sentences", "FULL-SENTENCES",
                     {"objective": "roberta", "data.format": "full_sentences"}, PAPER["full_sentences"]),
      common.variant("doc_sentences", "DOC-SENTENCES",
                     {"objective": "roberta", "data.format": "doc_sentences"}, PAPER["doc_sentences"]),
  ]
  return common.ablation(
      "roberta_table2", "Liu et al. 2019 (RoBERTa), Table 2: input format and NSP", base, variants,
      common.tasks(scale, ("mnli", "sst2")), budget="tokens",
      budget_description="same tokens: every variant trains the base's steps x batch x sequence length",
      paper_source="Liu et al. 2019, Table 2 (BERT-base size, BookCorpus + Wikipedia; dev MNLI-m and SST-2 "
                   "accuracy, medians over 5 finetuning seeds)",
      columns=COLUMNS)

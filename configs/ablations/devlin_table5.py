"""Devlin et al. 2019, Table 5: the effect of the pretraining tasks (BERT-base, dev sets).

    bert-jax ablate --config=configs/ablations/devlin_table5.py:small --workdir=runs/ablate/devlin_table5 \
        --config.base.data.train_files=prepared/news \
        --config.tasks.sst2.data_dir=../shared/data/tasks/rotten_tomatoes

(`prepared/news`: the `bert-jax prepare` command in configs/ablations/common.py.)

Variants, as in 5.1: MLM + NSP (BERT-base); "No NSP": MLM only, on one-segment inputs (`data.format`
full_sentences, the bert objective then has no sentence term); "LTR & No NSP": a left-to-right LM with a
causal mask (configs/ltr_base.py), kept at finetuning, its classifiers on the last token (as OpenAI GPT's; under
the mask [CLS] sees only itself). Left out: "+ BiLSTM" (no BiLSTM head here).
Budget: the same tokens for every variant. The LTR model's held-out metric is its own next-token
perplexity, not comparable with the MLM perplexity of the others.

`:paper` runs configs/bert_base.py:phase1 (900k steps of 256 x 128) for each variant; the paper's 10% of
steps at length 512 (phase 2) are not chained by the ablation runner.

The numbers below were checked against Table 5 of arXiv:1810.04805 (a text transcription of the PDF's pages
7-9), with its column names and 5.1's description of the variants.
"""

from configs import bert_base
from configs.ablations import common

# Devlin et al. 2019, Table 5 (dev): MNLI-m, QNLI, MRPC, SST-2 accuracy; SQuAD v1.1 F1. Checked against
# arXiv:1810.04805, Table 5. The row left out: "+ BiLSTM" 82.1 / 84.1 / 75.7 / 91.6 / 84.9.
PAPER = {
    "mlm_nsp": {"mnli_m": 84.4, "qnli": 88.4, "mrpc": 86.7, "sst2": 92.7, "squad_f1": 88.5},
    "no_nsp": {"mnli_m": 83.9, "qnli": 84.9, "mrpc": 86.5, "sst2": 92.6, "squad_f1": 87.9},
    "ltr_no_nsp": {"mnli_m": 82.1, "qnli": 84.3, "mrpc": 77.5, "sst2": 92.1, "squad_f1": 77.8},
}
COLUMNS = {"mnli": "mnli_m", "qnli": "qnli", "mrpc": "mrpc", "sst2": "sst2"}


def get_config(arg: str = "small"):
  scale = common.check_scale(arg)
  base = bert_base.get_config("phase1") if scale == "paper" else common.cpu_base(scale)
  one_segment = {"data.format": "full_sentences"}
  variants = [
      common.variant("mlm_nsp", "MLM + NSP (BERT)", {}, PAPER["mlm_nsp"]),
      common.variant("no_nsp", "No NSP", one_segment, PAPER["no_nsp"]),
      common.variant("ltr_no_nsp", "LTR & No NSP", {**one_segment, "objective": "ltr", "model.causal": True},
                     PAPER["ltr_no_nsp"], heldout_metric="eval/lm_perplexity"),
  ]
  return common.ablation(
      "devlin_table5", "Devlin et al. 2019, Table 5: ablation over the pretraining tasks", base, variants,
      common.tasks(scale), budget="tokens",
      budget_description="same tokens: every variant trains the base's steps x batch x sequence length",
      paper_source="Devlin et al. 2019, Table 5 (BERT-base, dev sets; MNLI-m, QNLI, MRPC, SST-2 accuracy)",
      columns=COLUMNS)

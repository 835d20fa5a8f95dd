"""Devlin et al. 2019, Table 6: model size (layers L, hidden size H, heads A) against held-out MLM
perplexity and dev accuracy.

    bert-jax ablate --config=configs/ablations/devlin_table6.py:small --workdir=runs/ablate/devlin_table6 \
        --config.base.data.train_files=prepared/news \
        --config.tasks.sst2.data_dir=../shared/data/tasks/rotten_tomatoes

`:paper` is the paper's grid, 3/768/12 ... 24/1024/16, each trained as BERT-base (configs/bert_base.py:phase1;
phase 2 is not chained), feed-forward size 4H. `:small` keeps the grid's shape at 1/3 of the layers and 1/8
of the width (the same heads, so the same ratios of L, H and A): 1/96/12, 2/96/3, 2/96/12, 4/96/12,
4/128/16, 8/128/16, each for 1000 steps of 64 x 64 tokens (4.1M tokens, half the other tables' 2000 steps:
the grid's six sizes cost about seven times one 2-layer, width-128 variant, and the table is sized to run in
about 90 minutes on a 2-core CPU). `:tiny` is 1/32/4 ... 2/64/4 for tests. Budget: the same tokens for every
size.
The paper's perplexity is on held-out training data (its 5.2) with its vocabulary; ours on the news corpus's
held-out documents with ours: compare orderings, not values. The plot is metric against encoder parameters.
The numbers below were checked against Table 6 of arXiv:1810.04805 (a text transcription of the PDF's
pages 7-9); 5.2 says its accuracies are the average of 5 finetuning restarts.
"""

from configs import bert_base
from configs.ablations import common

# Devlin et al. 2019, Table 6: (L, H, A) -> LM perplexity (held-out training data), MNLI-m, MRPC, SST-2 (dev
# accuracy). Checked against arXiv:1810.04805, Table 6.
PAPER = {
    (3, 768, 12): {"lm_ppl": 5.84, "mnli_m": 77.9, "mrpc": 79.8, "sst2": 88.4},
    (6, 768, 3): {"lm_ppl": 5.24, "mnli_m": 80.6, "mrpc": 82.2, "sst2": 90.7},
    (6, 768, 12): {"lm_ppl": 4.68, "mnli_m": 81.9, "mrpc": 84.8, "sst2": 91.3},
    (12, 768, 12): {"lm_ppl": 3.99, "mnli_m": 84.4, "mrpc": 86.7, "sst2": 92.9},
    (12, 1024, 16): {"lm_ppl": 3.54, "mnli_m": 85.7, "mrpc": 86.9, "sst2": 93.3},
    (24, 1024, 16): {"lm_ppl": 3.23, "mnli_m": 86.6, "mrpc": 87.8, "sst2": 93.7},
}
COLUMNS = {"heldout": "lm_ppl", "mnli": "mnli_m", "mrpc": "mrpc", "sst2": "sst2"}
SMALL = {(3, 768, 12): (1, 96, 12), (6, 768, 3): (2, 96, 3), (6, 768, 12): (2, 96, 12), (12, 768, 12): (4, 96, 12),
         (12, 1024, 16): (4, 128, 16), (24, 1024, 16): (8, 128, 16)}
TINY = {(3, 768, 12): (1, 32, 4), (6, 768, 3): (2, 32, 1), (6, 768, 12): (2, 32, 4), (12, 768, 12): (2, 48, 4),
        (12, 1024, 16): (2, 64, 4), (24, 1024, 16): (3, 64, 4)}


def get_config(arg: str = "small"):
  scale = common.check_scale(arg)
  base = bert_base.get_config("phase1") if scale == "paper" else common.cpu_base(scale)
  if scale == "small":
    base.train_steps = base.optimizer.total_steps = base.eval_every = 1000
  sizes = {"paper": {k: k for k in PAPER}, "small": SMALL, "tiny": TINY}[scale]
  variants = []
  for paper_size, (layers, hidden, heads) in sizes.items():
    overrides = {"model.num_layers": layers, "model.hidden_size": hidden, "model.num_heads": heads,
                 "model.intermediate_size": 4 * hidden}
    label = f"L={layers} H={hidden} A={heads}" + ("" if scale == "paper" else f" (paper {'/'.join(map(str, paper_size))})")
    variants.append(common.variant(f"L{layers}_H{hidden}_A{heads}", label, overrides, PAPER[paper_size]))
  return common.ablation(
      "devlin_table6", "Devlin et al. 2019, Table 6: model size", base, variants,
      common.tasks(scale, ("mnli", "mrpc", "sst2")), budget="tokens",
      budget_description="same tokens: every size trains the base's steps x batch x sequence length",
      paper_source="Devlin et al. 2019, Table 6 (LM perplexity on held-out training data; MNLI-m, MRPC, SST-2 "
                   "dev accuracy, 5 finetuning restarts)",
      columns=COLUMNS, plot="size", reference=variants[3].name)

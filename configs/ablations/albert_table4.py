"""Lan et al. 2020 (ALBERT), Table 4: cross-layer parameter sharing strategies.

    bert-jax ablate --config=configs/ablations/albert_table4.py:small --workdir=runs/ablate/albert_table4 \
        --config.base.data.train_files=prepared/news \
        --config.tasks.sst2.data_dir=../shared/data/tasks/rotten_tomatoes

Variants: ALBERT-base with all layers sharing one parameter set (objective albert, `model.share_layers`),
only the attention shared (`model.shared_sublayer = "attention"`), only the feed-forward network shared
(`"ffn"`), or nothing shared; each layer keeps its own LayerNorms when one sublayer is shared. All with
sentence-order prediction (`data.format` sop). `:paper` has the table's two embedding sizes, E = 768 and
E = 128; the CPU scales only E = 128 scaled with the width (H/6), four variants. Budget: the same tokens.

At E = 768 and 128 our encoders have 109.7M / 31.7M / 83.7M / 57.7M and 89.7M / 11.7M / 63.7M / 37.7M
parameters (not shared / all / attention / FFN; vocabulary 30,000 and the pooler included), the table's
108M / 31M / 83M / 57M and 89M / 12M / 64M / 38M.

`:paper` is configs/albert_base.py (4096 x 512, 125k steps, LAMB). The numbers are albert.py's TABLE4, checked
against arXiv:1909.11942, Table 4.
"""

from configs.ablations import albert
from configs.ablations import common

SHARING = {   # variant -> overrides
    "all_shared": {"model.share_layers": True, "objective": "albert"},
    "shared_attention": {"model.shared_sublayer": "attention"},
    "shared_ffn": {"model.shared_sublayer": "ffn"},
    "not_shared": {},
}


def get_config(arg: str = "small"):
  scale = common.check_scale(arg)
  base = albert.get_config(scale).base
  base.model.share_layers, base.objective = False, "bert"   # each variant says what it shares
  hidden = 768 if scale == "paper" else base.model.hidden_size   # the paper config names a preset
  sizes = (768, 128) if scale == "paper" else (128,)
  variants = []
  for e in sizes:
    embedding = e * hidden // 768
    for sharing, overrides in SHARING.items():
      label = f"{sharing.replace('_', '-')} E={embedding}" + ("" if scale == "paper" else f" (paper E={e})")
      variants.append(common.variant(f"{sharing}_e{embedding}", label, {"model.embedding_size": embedding, **overrides},
                                     {k: v for k, v in albert.TABLE4[sharing, e].items() if k != "params"}))
  return common.ablation(
      "albert_table4", "Lan et al. 2020 (ALBERT), Table 4: cross-layer parameter sharing", base, variants,
      common.tasks(scale, ("mnli", "sst2")), budget="tokens",
      budget_description="same tokens: every variant trains the base's steps x batch x sequence length",
      paper_source="Lan et al. 2020, Table 4 (ALBERT-base, dev MNLI and SST-2 accuracy)",
      columns=albert.COLUMNS, reference=f"all_shared_e{128 * hidden // 768}")

"""ModernBERT-large pretraining (Warner et al. 2024, arXiv:2412.13663): ModernBERT-base's recipe and phases
(configs/modernbert_base.py) with large's sizes and numbers.

    bert-jax pretrain --config=configs/modernbert_large.py --workdir=gs://bucket/modernbert_large \
        --config.data.train_files=gs://bucket/prepared/train
    (then `:extension` and `:decay` with `--config.init_from=<the previous phase's checkpoints>`)

From AnswerDotAI/ModernBERT commit 00220af, yamls/modernbert/modernbert-large-{pretrain,context-extension,
learning-rate-decay}.yaml ([P:line], [E:line], [D:line]): 28 layers, width 1024, 16 heads, intermediate 2624
[P:21-24]; seed 314 [P:128]; warmup 2B tokens [P:100]; lr 5e-4, weight decay 1e-5 [P:106, P:111] for 1.719T
tokens [P:115] at 4928 rows [P:117]; then lr 5e-5, weight decay 1e-6 [E:109, E:114] for 250B tokens [E:118]
at 616 rows [E:120]; then the 1-sqrt decay with lr 5e-5, weight decay 1e-6 [D:110, D:115] over 50B tokens
[D:119] at 624 rows [D:121]. Everything else is base's.

Not reproduced, beyond base's list: large started from ModernBERT-base's weights tiled from the middle
[P:119-125]; its phase-1 rate "was too high and required a restart" [P:106]: the paper reports 5e-4 for
900B tokens, then a roll-back and 5e-5 for the remaining 800B (set `--config.optimizer.learning_rate=5e-5`
with `--config.init_from=<the rolled-back checkpoint>`).
The batch-size warmup goes from 56 rows a device [P:77, P:130] on 8 GPUs = 448 rows to 4928 over 10B tokens
[P:78]: phase 1 has micro_batches = 4928 / 448 = 11 (no rounding; a larger one must stay a multiple of 11),
k rising from 1 to 11 over 1,982 steps (10B tokens at the full batch; they train 6/11 of that, ~5.5B).
The decay phase's 624 rows make its steps 5,111,808 tokens, against 5,046,272 before.
"""

from configs import modernbert_base

LARGE = {
    **modernbert_base.BASE,
    "size": (28, 1024, 16, 2624),
    "seed": 314,
    "tokens": {"phase1": 1_719_000_000_000, "extension": 250_000_000_000, "decay": 50_000_000_000},
    "rows": {"phase1": 4928, "extension": 616, "decay": 624},
    "learning_rate": {"phase1": 5e-4, "extension": 5e-5, "decay": 5e-5},
    "weight_decay": {"phase1": 1e-5, "extension": 1e-6, "decay": 1e-6},
    "warmup_tokens": 2_000_000_000,
    "batch_warmup_tokens": 10_000_000_000,
    "batch_warmup_min_rows": 448,
    "micro_batches_8192": 1,   # not sized for a topology yet (`bert-jax aot`)
}


def get_config(arg: str = ""):
  """`arg`: "phase1" (or empty), "extension" or "decay"."""
  return modernbert_base.get_config(arg, LARGE)

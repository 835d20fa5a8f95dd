"""ModernBERT-base pretraining (Warner et al. 2024, arXiv:2412.13663) in the released recipe's three phases.

    bert-jax pretrain --config=configs/modernbert_base.py --workdir=gs://bucket/modernbert_base \
        --config.data.train_files=gs://bucket/prepared/train
    bert-jax pretrain --config=configs/modernbert_base.py:extension --workdir=gs://bucket/modernbert_base_ext \
        --config.data.train_files=gs://bucket/prepared/train --config.init_from=gs://bucket/modernbert_base/checkpoints
    bert-jax pretrain --config=configs/modernbert_base.py:decay --workdir=gs://bucket/modernbert_base_decay \
        --config.data.train_files=gs://bucket/prepared/train --config.init_from=gs://bucket/modernbert_base_ext/checkpoints

Phases: `phase1` (the default) at 1024 tokens, `extension` to 8192 tokens at a constant learning rate,
`decay` at 8192 with the 1-sqrt decay. Each continues the previous one's step, optimizer and schedule
(`init_from`): one warmup-stable-decay schedule over the three, its peak the phase's learning rate.

Every number is read from the release's configs, AnswerDotAI/ModernBERT commit 00220af ("Update & add
ModernBERT training configs"), yamls/modernbert/modernbert-base-{pretrain,context-extension,
learning-rate-decay}.yaml, cited below as [P:line], [E:line], [D:line]:
- Model [P:19-60]: vocabulary 50368, 22 layers, width 768, 12 heads, intermediate 1152; rope attention,
  no qkv/out/mlp biases, prenorm with embedding norm and final norm, GLU MLP with gelu, LayerNorm eps 1e-5
  without bias, sliding window 128 with a global layer every 3; attention, embedding and MLP dropout 0.0.
  RoPE base 10000 in phase 1 [P:52]; 160000 in global layers and 10000 in local ones from the extension
  on [E:56, E:59] (the released checkpoint's).
- Data: 30% masking [P:6] (80/10/10 as transformers' collator, src/sequence_packer.py:293), no NSP, sequence
  packing [P:76] of documents truncated to max_seq_len (src/text_data.py), 1024 tokens [P:4] then 8192 [E:7].
- Optimizer: decoupled StableAdamW [P:105], lr 8e-4 [P:106], betas (0.9, 0.98) [P:107-109], eps 1e-6 [P:110],
  weight decay 1e-5 [P:111], not on norms and biases [P:112]; no gradient clipping (main.py warns that
  StableAdamW replaces it). Schedule: warmup_stable_decay, warmup 3B tokens, no decay [P:98-102], for 1.719T
  tokens [P:115] at 4608 rows [P:117]; then lr 3e-4 constant [E:103-109] for 250B tokens [E:118] at 576 rows
  [E:120]; then one_minus_sqrt to 0.001 x peak over the phase [D:103-105], lr 3e-4 [D:110], 50B tokens [D:119],
  576 rows [D:121]. Seed 17 [P:121].
Steps are tokens / (rows x length), rounded up: every phase has 4,718,592 tokens a step.

Batch-size warmup [P:77-78]: from the per-device micro-batch, 96 rows [P:123] on 8 GPUs = 768 rows, to 4608
over the first 50B tokens. Here (bert_jax/steps.py) phase 1 has micro_batches = 4608 / 768 = 6 and step t
trains on the first k(t) of them, k rising linearly from 1 to 6 over the warmup's steps (each k holds for
a sixth of them), the other micro-batches' rows discarded. No rounding of the rows: 768 divides 4608; the
ramp moves in 768-row micro-batches where the release's moves 8 rows at a time (one per GPU). A larger
micro_batches for memory must stay a multiple of 6. The warmup's steps are 50B tokens over a full step's
tokens, rounded up, as for every token count here (10,597 steps); those steps train 7/12 of that, ~29B
tokens, where the release counts the 50B tokens themselves (~18.2k steps of its ramp) and its
learning-rate warmup of 3B tokens falls inside the ramp, at small batches.

Not reproduced: the attention-output dropout 0.1 [P:28] (our hidden dropout would also act after the MLP,
where the recipe has 0.0). Evaluation at 15% masking [P:90] (held-out batches mask as training does).
Masking draws round(30% x n) tokens per example, not each token independently; the initialization is
BERT's normal(0.02), not the release's `full_megatron` [P:20]. ModernBERT's BPE tokenizer is not built in:
prepare the data with a 50368-entry vocabulary.
"""

import math

from configs import common

# What differs between base and large (configs/modernbert_large.py); phases are "phase1", "extension", "decay".
BASE = {
    "size": (22, 768, 12, 1152),                          # layers, width, heads, intermediate [P:21-24]
    "seed": 17,                                           # [P:121]
    "tokens": {"phase1": 1_719_000_000_000, "extension": 250_000_000_000, "decay": 50_000_000_000},
    "rows": {"phase1": 4608, "extension": 576, "decay": 576},
    "learning_rate": {"phase1": 8e-4, "extension": 3e-4, "decay": 3e-4},
    "weight_decay": {"phase1": 1e-5, "extension": 1e-5, "decay": 1e-5},
    "warmup_tokens": 3_000_000_000,                       # [P:100]
    "batch_warmup_tokens": 50_000_000_000,                # [P:78]
    "batch_warmup_min_rows": 768,                         # 96 a device [P:77, P:123] x 8 GPUs
    # Memory, not recipe (the step's math is the same): the 8192-token phases' 576 rows in 3 passes, so that
    # 3 rows of 8192 a device fit v5e:8x8's 16 GiB (`bert-jax aot`: docs/objectives.md; measured for base).
    "micro_batches_8192": 3,
}
LENGTH = {"phase1": 1024, "extension": 8192, "decay": 8192}   # [P:4], [E:7], [D:7]
PHASES = tuple(LENGTH)
MASK_RATE = 0.3                                           # [P:6]


def phase_steps(recipe: dict, phase: str) -> int:
  """Optimizer steps of a phase: its tokens over the tokens of one full batch, rounded up."""
  return math.ceil(recipe["tokens"][phase] / (recipe["rows"][phase] * LENGTH[phase]))


def full_steps(recipe: dict, tokens: int) -> int:
  """Steps of phase 1 that hold `tokens` at its full batch, rounded up."""
  return math.ceil(tokens / (recipe["rows"]["phase1"] * LENGTH["phase1"]))


def get_config(arg: str = "", recipe: dict = BASE):
  """`arg`: "phase1" (or empty), "extension" or "decay"."""
  phase = arg or "phase1"
  if phase not in PHASES:
    raise ValueError(f"unknown phase {arg!r}; one of {PHASES}")
  c = common.pretrain_config()
  c.objective = "modernbert"
  m = c.model
  m.num_layers, m.hidden_size, m.num_heads, m.intermediate_size = recipe["size"]
  m.vocab_size = 50_368
  m.type_vocab_size = 0
  m.max_position_embeddings = 8192          # unused with RoPE; transformers' ModernBertConfig default
  m.geglu, m.pre_norm, m.final_norm = True, True, True
  m.norm_bias, m.dense_bias = False, False
  m.layer_norm_eps = 1e-5
  m.global_attn_every_n_layers, m.local_attention = 3, 128
  m.hidden_dropout, m.attention_dropout = 0.0, 0.0
  # The release attends with FlashAttention 2 over unpadded sequences and sliding windows; on TPU this is
  # Pallas' splash kernel with segment ids and a local mask (bert_jax/models/splash.py), XLA's attention under
  # the same mask elsewhere. Without it 8192 tokens materialise [rows, heads, 8192, 8192] scores.
  m.attention_kernel = "splash"
  if phase == "phase1":
    m.rope_theta = 10_000.0
  else:
    m.rope_theta, m.local_rope_theta = 160_000.0, 10_000.0
  c.data.format = "doc_sentences"           # documents apart; packing keeps them from attending to each other
  c.data.packing = True
  c.data.seq_length = LENGTH[phase]
  c.data.masked_lm_prob = MASK_RATE
  c.data.max_predictions_per_seq = math.ceil(MASK_RATE * LENGTH[phase])
  c.global_batch_size = recipe["rows"][phase]
  c.seed = recipe["seed"]
  if phase == "phase1":   # the batch-size warmup: whole micro-batches of min_rows each (bert_jax/steps.py)
    c.micro_batches = recipe["rows"]["phase1"] // recipe["batch_warmup_min_rows"]
    c.batch_size_warmup_min_rows = recipe["batch_warmup_min_rows"]
    c.batch_size_warmup_steps = full_steps(recipe, recipe["batch_warmup_tokens"])
  else:
    c.micro_batches = recipe["micro_batches_8192"]
  ends = {p: sum(phase_steps(recipe, q) for q in PHASES[:i + 1]) for i, p in enumerate(PHASES)}
  c.train_steps = ends[phase]
  o = c.optimizer
  o.name = "stable_adamw"
  o.learning_rate = recipe["learning_rate"][phase]
  o.weight_decay = recipe["weight_decay"][phase]
  o.b1, o.b2, o.eps = 0.9, 0.98, 1e-6
  o.clip_norm = 0.0
  o.schedule = "wsd"
  o.warmup_steps = full_steps(recipe, recipe["warmup_tokens"])
  o.total_steps = ends["decay"]
  o.decay_steps = phase_steps(recipe, "decay")
  o.decay_shape = "1-sqrt"
  o.final_lr_fraction = 0.001
  return c

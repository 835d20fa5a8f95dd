"""What every ablation config is made of; `configs/ablations/<table>.py` import this.

An ablation config (read by bert_jax/ablate/) has:
  name, title     the table's short name and what it is (paper, table)
  base            the pretraining config every variant starts from (configs/common.py fields)
  variants        tuple of (name, label, overrides: ((dotted field, value), ...), heldout_metric, paper: {column: number})
  reference       the variant differences are measured against ("" = the first)
  budget          kind "tokens" (every variant trains the base's steps x batch x length) or "flops"
                  (steps scaled so every variant spends the FLOPs of `reference`), and a description
  tasks           task name -> finetuning config (configs/finetune/), one configuration over `sweep.seeds`
  paper           source (paper, table, split), columns (our measurement -> the paper's column), note
  plot            "bars" (objective tables) or "size" (metric against parameters)

Scales (`:arg`): "paper" is the paper's recipe (TPU pods), "small" a 2-core CPU in about 90 minutes a table
(not yet measured) on a `bert-jax prepare` directory of the news corpus with rotten_tomatoes as SST-2,
"tiny" seconds a variant (tests). Data paths come on the command line:
  --config.base.data.train_files=PREPARED_DIR --config.tasks.sst2.data_dir=SST2_FORMAT_DIR
"""

import importlib

import ml_collections

from configs import tiny as tiny_config
from configs.finetune import common as finetune_common

SCALES = ("tiny", "small", "paper")
MLM_PERPLEXITY = "eval/mlm_perplexity"
# The news corpus prepared with its own vocabulary of this size (the :small command in each table):
#   bert-jax prepare --input=../shared/data/corpora/news_articles.jsonl --text_key=text \
#       --output_dir=prepared/news --vocab_size=8192 --eval_fraction=0.01
SMALL_VOCAB = 8192


def check_scale(arg: str) -> str:
  if arg not in SCALES:
    raise ValueError(f"ablation scale must be one of {SCALES}, got {arg!r} (e.g. --config=...table5.py:small)")
  return arg


def variant(name: str, label: str, overrides: dict | None = None, paper: dict | None = None,
            heldout_metric: str = MLM_PERPLEXITY) -> ml_collections.ConfigDict:
  v = ml_collections.ConfigDict()
  v.name, v.label, v.heldout_metric = name, label, heldout_metric
  v.overrides = tuple((overrides or {}).items())
  v.paper = ml_collections.ConfigDict(paper or {})
  return v


def ablation(name: str, title: str, base, variants, tasks: dict, *, budget: str, budget_description: str,
             paper_source: str, columns: dict, note: str = "", plot: str = "bars",
             reference: str = "", step_ratios: dict | None = None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.name, c.title, c.base, c.variants, c.reference, c.plot = name, title, base, tuple(variants), reference, plot
  c.budget = ml_collections.ConfigDict({"kind": budget, "reference": reference or variants[0].name,
                                        "description": budget_description,
                                        "step_ratios": ml_collections.ConfigDict(step_ratios or {})})
  c.tasks = ml_collections.ConfigDict(tasks)
  c.paper = ml_collections.ConfigDict({"source": paper_source, "note": note,
                                       "columns": ml_collections.ConfigDict(columns)})
  return c


# ------------------------------------------------------------------------------------------------
# Pretraining bases at the two CPU scales (the paper scale uses each paper's own config).


def cpu_base(scale: str) -> ml_collections.ConfigDict:
  """BERT (MLM + NSP) sized for the CPU: `tiny.py`'s post-LN encoder, float32, no dropout.

  tiny: 1 layer of width 32, 6 steps of 16 x 32 tokens (a test's own small corpus, vocabulary 128).
  small: 2 layers of width 128, 2000 steps of 64 x 64 tokens (8.2M tokens) on the news corpus with an
  8192-word vocabulary.
  """
  c = tiny_config.get_config()
  c.data.train_files = ""   # --config.base.data.train_files=...
  layers, hidden = (1, 32) if scale == "tiny" else (2, 128)
  c.model.num_layers, c.model.hidden_size, c.model.num_heads = layers, hidden, 2
  c.model.intermediate_size = 4 * hidden
  c.fill_mask_examples = 0
  c.keep_checkpoints = 1
  if scale == "tiny":
    c.model.vocab_size, c.model.max_position_embeddings = 128, 32
    c.data.seq_length, c.data.max_predictions_per_seq = 32, 5
    c.global_batch_size, c.train_steps = 16, 6
    c.optimizer.learning_rate, c.optimizer.warmup_steps = 5e-3, 2
    c.log_every, c.eval_every, c.eval_steps, c.checkpoint_every = 1, 1000, 2, 3
  else:
    c.model.vocab_size, c.model.max_position_embeddings = SMALL_VOCAB, 128
    c.data.seq_length, c.data.max_predictions_per_seq = 64, 10   # round(64 * 0.15)
    c.global_batch_size, c.train_steps = 64, 2000
    c.optimizer.learning_rate, c.optimizer.warmup_steps = 1e-3, 100
    # 8 x 64 rows of 64 tokens: about the news corpus's held-out 36k tokens (1% of its documents).
    c.log_every, c.eval_every, c.eval_steps, c.checkpoint_every = 100, 1000, 8, 250
  c.optimizer.total_steps = c.train_steps
  return c


def sst2(scale: str) -> ml_collections.ConfigDict:
  """SST-2 at a CPU scale (rotten_tomatoes in SST-2 format), one configuration over seeds. small: 4000
  sentences of at most 64 tokens, 2 epochs at lr 1e-4, 3 seeds; tiny: 32 sentences, 1 epoch, 2 seeds."""
  c = finetune_common.get_config()
  c.task = "sst2"
  c.data_dir = ""   # --config.tasks.sst2.data_dir=...
  c.write_predictions, c.keep_best_checkpoint = False, False
  if scale == "small":
    c.max_train_examples, c.max_seq_length = 4000, 64
    c.batch_size, c.learning_rate, c.num_epochs = 32, 1e-4, 2
    c.sweep.seeds = (0, 1, 2)
  else:
    c.max_train_examples, c.max_eval_examples, c.max_seq_length = 32, 32, 32
    c.batch_size, c.learning_rate, c.num_epochs, c.log_every_steps = 8, 1e-3, 1, 1
    c.sweep.seeds = (0, 1)
  return c


def glue_task(task: str) -> ml_collections.ConfigDict:
  """A task's own config (configs/finetune/<task>.py) at the paper's scale: Devlin et al. 2019, A.3 (batch
  32, lr 2e-5, 3 epochs; the paper picks these per task from its grid), 5 seeds."""
  c = importlib.import_module(f"configs.finetune.{task}").get_config()
  c.write_predictions, c.keep_best_checkpoint = False, False
  c.batch_size, c.learning_rate, c.num_epochs = 32, 2e-5, 3
  c.sweep.seeds = (0, 1, 2, 3, 4)
  return c


def tasks(scale: str, paper_tasks=("mnli", "qnli", "mrpc", "sst2")) -> dict:
  """The downstream tasks: at the CPU scales SST-2 only, at the paper's scale those of its table."""
  return {t: glue_task(t) for t in paper_tasks} if scale == "paper" else {"sst2": sst2(scale)}

"""Distilling the 6-layer MiniLM-L6-H384 checkpoint into a 3-layer student: DistilBERT's recipe
(`distilbert_base.py`) at a size that trains on one host.

    bert-jax prepare --input=news.jsonl --output_dir=data/news_minilm --vocab_file=minilm/vocab.txt
    bert-jax pretrain --config=configs/distilbert_minilm.py --workdir=runs/distil_minilm \
        --config.distill.teacher=minilm --config.data.train_files=data/news_minilm

The student is the teacher's width (384, 12 heads, FFN 1536) with 3 layers, started from the teacher's
layers 0, 2 and 5 (round(linspace(0, 5, 3)); 0, 2, 4 is `--config.distill.student_layers="(0, 2, 4)"`).
Sized for a 2-core CPU: batches of 32 rows of 64 tokens, and the soft targets at the masked positions only
(`distill.soft_positions = "masked"`, the release's `--restrict_ce_to_mask`): two vocabulary projections
at every token would cost more than both encoders. The rest is the DistilBERT recipe.

The MiniLM checkpoint is a `BertModel`, without the MLM head the soft targets come from: give it one first
by MLM training from its weights on the same data, then name that run as the teacher. Measured this way
(docs/objectives.md, "DistilBERT"):

    bert-jax pretrain --config=configs/distilbert_minilm.py --workdir=runs/teacher --config.objective=bert \
        --config.model.num_layers=6 --config.model.type_vocab_size=2 --config.init_from=minilm \
        --config.init_from_params_only=True --config.train_steps=200 --config.optimizer.total_steps=200 \
        --config.optimizer.warmup_steps=20 --config.optimizer.learning_rate=1e-4 --config.dtype=float32 \
        --config.data.train_files=data/news_minilm
    bert-jax pretrain --config=configs/distilbert_minilm.py --workdir=runs/student \
        --config.distill.teacher=runs/teacher --config.data.train_files=data/news_minilm --config.dtype=float32 \
        --config.train_steps=300 --config.optimizer.total_steps=300 --config.optimizer.warmup_steps=15
"""

from configs import distilbert_base

STEPS = 600


def get_config(arg: str = ""):
  c = distilbert_base.get_config(arg, layers=3)
  c.model.preset = "L-3_H-384_A-12"
  c.model.vocab_size = 30522
  c.distill.teacher_preset = "L-6_H-384_A-12"
  c.data.seq_length, c.data.max_predictions_per_seq = 64, 10
  c.distill.soft_positions = "masked"
  c.global_batch_size = 32
  c.micro_batches = 1
  c.train_steps = STEPS
  c.optimizer.warmup_steps = int(0.05 * STEPS)
  c.optimizer.total_steps = STEPS
  c.eval_every = 100
  c.checkpoint_every = 100
  c.log_every = 100
  c.topology = ""
  c.peak_flops_per_device = 0.0
  c.mesh.fsdp = 1
  return c

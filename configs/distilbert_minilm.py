"""Distilling the 6-layer MiniLM-L6-H384 checkpoint into a 3-layer student: DistilBERT's recipe
(`distilbert_base.py`) at a size that trains on one host.

    bert-jax prepare --input=news.jsonl --output_dir=data/news_minilm --vocab_file=minilm/vocab.txt
    bert-jax pretrain --config=configs/distilbert_minilm.py --workdir=runs/distil_minilm \
        --config.distill.teacher=minilm --config.data.train_files=data/news_minilm

The student is the teacher's width (384, 12 heads, FFN 1536) with 3 layers, started from the teacher's
layers 0, 2 and 5 (round(linspace(0, 5, 3)); 0, 2, 4 is `--config.distill.student_layers=0,2,4`). Batches
of 32 rows of 128 tokens; the rest is the DistilBERT recipe.
"""

from configs import distilbert_base

STEPS = 2_000


def get_config(arg: str = ""):
  c = distilbert_base.get_config(arg, layers=3)
  c.model.preset = "L-3_H-384_A-12"
  c.model.vocab_size = 30522
  c.distill.teacher_preset = "L-6_H-384_A-12"
  c.data.seq_length, c.data.max_predictions_per_seq = 128, 20
  c.global_batch_size = 32
  c.micro_batches = 1
  c.train_steps = STEPS
  c.optimizer.warmup_steps = int(0.05 * STEPS)
  c.optimizer.total_steps = STEPS
  c.eval_every = 500
  c.checkpoint_every = 500
  c.log_every = 100
  c.topology = ""
  c.peak_flops_per_device = 0.0
  c.mesh.fsdp = 1
  return c

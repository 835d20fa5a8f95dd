"""SpanBERT-base pretraining as in Joshi et al. 2020 (arXiv:1907.10529), 3 and 4.

    bert-jax pretrain --config=configs/spanbert_base.py --workdir=gs://bucket/spanbert_base \
        --config.data.train_files=gs://bucket/prepared/train --config.data.vocab_file=gs://bucket/vocab.txt

Recipe: span masking (3.1: whole-word spans, lengths ~ Geometric(p = 0.2) clipped at 10, 15% of the tokens,
80/10/10 per span) with the span boundary objective (3.2), single contiguous segments of up to 512 tokens and
no NSP (3.3); BERT's model sizes and cased WordPiece vocabulary. 4.2 ("Implementation"): AdamW with lr 1e-4,
b1 0.9, b2 0.999, "a decoupled weight decay of 0.1" and "an epsilon of 1e-8", 10,000 warmup steps then linear
decay, dropout 0.1, batch 256 sequences of up to 512 tokens, 2.4M steps (unlike BERT no 128-token phase), no
short sequences (4.2). Checked against arXiv:1907.10529, 4.2 (a text transcription of its ar5iv HTML).

Gradient clipping as the release's run had it (facebookresearch/SpanBERT pretraining/README.md: `--clip-norm 1.0`
on 32 GPUs, 8 sequences each). Its fairseq trainer clips after `multiply_grads(world_size / sample_size)`
(trainer.py; the command has no `--no-sample-size-normalization`): PyTorch's DDP has averaged the workers'
gradients of their own mean losses, and sample_size is the batch's masked tokens, 256 x ceil(0.15 x 510) = 19,712.
So it clipped the mean loss's gradient at a norm of 19,712 / 32 = 616, where our step clips the mean loss's own
gradient: `optimizer.clip_norm` 616, not 1.0. (Adam's update is otherwise blind to that scale, but for its eps of
1e-8, which the release's 616 times smaller gradients meet sooner; not reproduced.)
"""

from bert_jax import tpu_chips
from configs import common

BATCH, STEPS = 256, 2_400_000


def get_config(arg: str = "", preset: str = "base"):
  """`arg` is unused (one phase); kept for the `:arg` convention."""
  del arg
  c = common.pretrain_config()
  c.objective = "spanbert"
  c.model.preset = preset
  c.model.vocab_size = 28_996     # BERT's cased vocabulary
  c.data.do_lower_case = False
  c.data.format = "doc_sentences"
  c.data.short_seq_prob = 0.0   # 4.2: "We remove all the short-sequence strategies used before"
  c.data.span_masking = True
  # The 10% "random" replacements as SpanBERT's code draws them (masking.py, `span_masking`: from the corpus'
  # token stream): tokens of the example's own text, not uniform over the vocabulary.
  c.data.random_token_pool = "input"
  c.data.seq_length, c.data.max_predictions_per_seq = 512, 80
  with c.unlocked():   # the boundary head as the release's pretraining command has it (objectives/spanbert.py):
    c.sbo_max_targets = 15     # --max-pair-targets 15: a span's first 15 tokens are boundary targets
    c.sbo_position_size = 200  # --pair-positional-embedding-size 200
  c.global_batch_size = BATCH
  c.train_steps = STEPS
  c.optimizer.learning_rate = 1e-4
  c.optimizer.weight_decay = 0.1
  c.optimizer.eps = 1e-8
  c.optimizer.clip_norm = BATCH * 77 / 32   # the release's clip of 1.0 on gradients scaled by 32 / 19,712 (above)
  c.optimizer.warmup_steps = 10_000
  c.optimizer.total_steps = STEPS
  c.topology = "v3:8x8"
  c.peak_flops_per_device = tpu_chips.peak_flops_per_device(c.topology)   # for MFU
  c.mesh.data, c.mesh.fsdp = -1, 1
  return c

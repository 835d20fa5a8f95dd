"""DistilBERT pretraining as in Sanh et al. 2019 (arXiv:1910.01108), section 3 and Hugging Face's released
`examples/research_projects/distillation` (train.py defaults, distiller.py).

    bert-jax pretrain --config=configs/distilbert_base.py --workdir=gs://bucket/distilbert \
        --config.distill.teacher=gs://bucket/bert_base_uncased \
        --config.data.train_files=gs://bucket/prepared/train   # prepared with the teacher's vocab.txt

The student: BERT-base's width (768, 12 heads, FFN 3072) with 6 layers, no token types and no pooler (section
3), started from the teacher's embeddings, MLM head and layers 0, 2, 4, 7, 9, 11 (the release's
`scripts/extract_distilbert.py`). Loss 5.0 x soft cross-entropy at temperature 2 + 2.0 x MLM + 1.0 x cosine
(the release's `alpha_ce`, `alpha_mlm`, `alpha_cos`). Dynamic masking, 15% of tokens 80/10/10, no NSP; batches
of up to 4K examples by gradient accumulation (section 3: "very large batches (up to 4K examples per batch)
using gradient accumulation"); Adam lr 5e-4 with 5% linear warmup then linear decay, betas (0.9, 0.98) (the
release's `distiller.py`), eps 1e-6, no weight decay, gradient norm clipped at 5.0 (release defaults). Not
reproduced: the release's `mlm_smoothing` (masked positions drawn with probability proportional to count^-0.7)
and its grouping of sequences by length; our rows are 512-token full-sentence rows.

Steps: the release trains 3 epochs (`n_epoch`) over BERT's corpus (English Wikipedia and the Toronto Book
Corpus, about 3.3B words). At an assumed 1.3 WordPiece tokens per word that is about 4.3B tokens per
epoch, 2,050 steps of 4096 x 512 tokens: 6,200 steps for 3 epochs (our estimate; the paper gives
none, only about 90 hours on 8 V100s).
"""

from bert_jax import tpu_chips
from configs import common

BATCH = 4096
STEPS = 6_200


def get_config(arg: str = "", layers: int = 6, teacher_preset: str = "base"):
  """`arg` is unused (one phase); kept for the `:arg` convention."""
  del arg
  c = common.pretrain_config()
  c.objective = "distilbert"
  c.model.preset = teacher_preset
  c.model.num_layers = layers
  c.model.type_vocab_size = 0
  c.distill.teacher_preset = teacher_preset   # --config.distill.teacher names the checkpoint
  c.data.format = "full_sentences"
  c.data.seq_length, c.data.max_predictions_per_seq = 512, 80
  c.global_batch_size = BATCH
  c.train_steps = STEPS
  c.optimizer.learning_rate = 5e-4
  c.optimizer.warmup_steps = int(0.05 * STEPS)
  c.optimizer.total_steps = STEPS
  c.optimizer.b2 = 0.98   # distiller.py: AdamW(..., betas=(0.9, 0.98))
  c.optimizer.eps = 1e-6
  c.optimizer.weight_decay = 0.0
  c.optimizer.clip_norm = 5.0
  c.topology = "v3:8x8"
  c.peak_flops_per_device = tpu_chips.peak_flops_per_device(c.topology)   # for MFU
  c.mesh.data, c.mesh.fsdp = -1, 8
  c.micro_batches = 8
  return c

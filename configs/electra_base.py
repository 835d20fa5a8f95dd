"""ELECTRA-Base pretraining as in Clark et al. 2020 (arXiv:2003.10555), appendix A, Table 6, checked
against the released code (github.com/google-research/electra at 8a46635).

    bert-jax pretrain --config=configs/electra_base.py --workdir=gs://bucket/electra_base \
        --config.data.train_files=gs://bucket/prepared/train --config.data.vocab_file=gs://bucket/vocab.txt

Where each value comes from ("cp" is the release's configure_pretraining.py; the base/large block at
cp:120-132 is commented out in the release, "see Table 6 in the paper"):
- Sizes (Table 6): small 12 x 256 (4 heads, FFN 1024, E 128: cp:118-119), base 12 x 768 (12, 3072, E 768:
  cp:126), large 24 x 1024 (16, 4096, E 1024: cp:130); layers and width util/training_utils.py:98-103,
  heads = H / 64 and FFN = 4H (:109-110); dropout 0.1, 512 positions, 2 token types, init 0.02, erf
  GELU (model/modeling.py:46-50, 310); vocabulary 30,522, uncased (cp:65-66). No pooler (the release's
  discriminator reads no [CLS] vector; transformers' ElectraModel has none).
- Generator: hidden size x 1/4 (cp:75), 1/3 for base (cp:127, 0.33333), as many layers (cp:74), FFN 4x
  and hidden/64 heads (run_pretraining.py:342-347) = our `generator_config` at these sizes. Token,
  position and type embeddings and their LayerNorm are shared (`untied_generator_embeddings = False`,
  cp:71, so both models build "electra/embeddings": model/modeling.py:187-189, 203-205); the generator
  has its own projection E -> its width (modeling.py:225-228 in scope "generator") and ties its
  output to the word embeddings (run_pretraining.py:177-178, 266). All else untied (cp:73).
- Loss: generator MLM + 50 x discriminator (cp:38-39, run_pretraining.py:96-108).
- Masking: mask_prob 0.15 (cp:40), 0.25 for large (cp:131); max_predictions_per_seq =
  int((mask_prob + 0.005) * max_seq_length) (cp:106-107): 19, 79, 130; round(real tokens x mask_prob)
  per sequence, [CLS] and [SEP] counted, at least 1 (pretrain/pretrain_helpers.py:173-176); of the
  chosen tokens 85% become [MASK] and 15% stay as they are, none random (pretrain_helpers.py:201-202).
- Optimisation: lr 5e-4 small (cp:43), 2e-4 base and large (cp:124); Adam b1 0.9, b2 0.999, eps 1e-6,
  no decay on LayerNorm and biases (model/optimization.py:50-56) and no bias correction
  (optimization.py:113-119); weight decay 0.01 (cp:45); 10k warmup steps (cp:46), linear decay to 0
  (cp:44, optimization.py:36-42); global-norm clipping 1.0 (optimization.py:62).
- Batch and length: 128 x 128 tokens for small (cp:82-83); 256 (cp:128) and 2048 (cp:132) sequences
  of 512 tokens (cp:123) for base and large; 5% of them with a random shorter target length
  (build_pretraining_dataset.py, `ExampleBuilder._create_example`).
- Rows: `data.format` "doc_segments", as `ExampleBuilder`: a document's sentences up to the target, never
  across documents; 90% of rows `[CLS] A [SEP] B [SEP]` (B's token type 1, which finetuning on pairs reads),
  10% one segment (bert_jax/data/instances.py; one difference is noted there). Steps: 1M for small (cp:51); 766k
  and 400k for base and large (Table 6; the release has no per-size value).

Not reproduced: the release multiplies the decayed rate by min(1, step / warmup) (optimization.py:43-45)
where we warm up to the full rate (at most 1% apart, during warmup); it draws the masked positions
with replacement (pretrain_helpers.py:188-189), we without; it never masks a [MASK] found in the text
(pretrain_helpers.py:135), we may; it masks each batch anew at every step, we once per example and epoch.
"""

from bert_jax import tpu_chips
from configs import common

# size -> (layers, hidden, heads, embedding size, generator fraction, mask rate, lr, batch, steps, length)
SIZES = {
    "small": (12, 256, 4, 128, 1 / 4, 0.15, 5e-4, 128, 1_000_000, 128),
    "base": (12, 768, 12, 768, 1 / 3, 0.15, 2e-4, 256, 766_000, 512),
    "large": (24, 1024, 16, 1024, 1 / 4, 0.25, 2e-4, 2048, 400_000, 512),
}


def get_config(arg: str = "", size: str = "base"):
  """`arg` is unused (one phase); kept for the `:arg` convention."""
  del arg
  layers, hidden, heads, embedding, fraction, mask_rate, lr, batch, steps, length = SIZES[size]
  c = common.pretrain_config()
  c.objective = "electra"
  c.model.preset = f"L-{layers}_H-{hidden}_A-{heads}"
  c.model.vocab_size = 30_522   # cp:65
  if embedding != hidden:
    c.model.embedding_size = embedding
  with c.unlocked():
    c.generator_hidden_fraction = fraction   # bert_jax/objectives/electra.py
  c.data.format = "doc_segments"   # build_pretraining_dataset.py's ExampleBuilder (bert_jax/data/instances.py)
  c.data.short_seq_prob = 0.05   # build_pretraining_dataset.py: random.random() < 0.05, randint(5, max_length)
  c.data.do_lower_case = True
  c.data.masked_lm_prob = mask_rate
  c.data.seq_length, c.data.max_predictions_per_seq = length, int((mask_rate + 0.005) * length)
  c.data.mask_token_prob, c.data.random_token_prob = 0.85, 0.0
  c.global_batch_size = batch
  c.train_steps = steps
  c.optimizer.learning_rate = lr
  c.optimizer.warmup_steps = 10_000
  c.optimizer.total_steps = steps
  c.optimizer.bias_correction = False
  c.topology = "v3:8x8"
  c.peak_flops_per_device = tpu_chips.peak_flops_per_device(c.topology)   # for MFU
  c.mesh.data, c.mesh.fsdp = -1, 1 if size == "small" else 8
  return c

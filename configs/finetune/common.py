"""Fields shared by every finetuning config; `configs/finetune/<task>.py` import this and override.

One run uses the single values (`batch_size`, `learning_rate`, `num_epochs`, `seed`); `bert-jax sweep`
tries the lists in `config.sweep`. The defaults are the grid of Devlin et al. 2019, Appendix A.3:
batch {16, 32}, learning rate {5e-5, 3e-5, 2e-5}, epochs {2, 3, 4}, Adam with warmup over the first
10% of steps then linear decay, weight decay 0.01, dropout 0.1.
"""

import ml_collections

from configs import common


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  # Task (bert_jax/finetune/tasks.py): `get_task(task, **task_opts)`, read from `data_dir`
  # (a directory of the original files, or "tfds" with `task_opts.tfds_data_dir`).
  c.task = ""
  c.task_opts = ml_collections.ConfigDict()
  # How a sequence classifier reads the encoder: "pooler" (BERT), "cls" or "mean" (ModernBERT); "": the
  # checkpoint's own (bert_jax/finetune/init.py `classifier_pooling`).
  c.task_opts.classifier_pooling = ""
  # With data_dir "tfds" (or "tfds:<name>"): the directory holding the prepared TFDS dataset. Nothing is
  # downloaded; a dataset not prepared there is an error that says how to prepare it.
  c.task_opts.tfds_data_dir = ""
  c.data_dir = ""
  c.train_split = "train"
  c.eval_split = ""            # empty: the task's dev split
  c.max_train_examples = 0     # 0 = all; a subset for quick runs
  c.max_eval_examples = 0
  c.max_seq_length = 128

  # Initialisation. Format "auto" detects: HF directory (config.json), Google TF checkpoint
  # (*.index), bert_jax pretraining checkpoint (orbax), or a finetuned checkpoint from
  # `bert-jax finetune` (its encoder is kept and a new head initialised: two-stage finetuning).
  c.init_checkpoint = ""
  c.init_checkpoint_format = "auto"  # auto | hf | tf | bert_jax | finetuned
  c.bert_config_json = ""            # TF checkpoints and bert_jax checkpoints without a config
  c.vocab_file = ""                  # empty: vocab.txt / *.model beside the checkpoint
  # None: as the tokenizer_config.json beside the vocabulary or checkpoint says (a cased checkpoint's says
  # false), else True.
  c.do_lower_case = ml_collections.config_dict.placeholder(bool)
  # The model of a pretraining config: its size when there is no checkpoint (tests, from scratch), its
  # dropout rates (when set) and how it computes (models/config.py COMPUTE_FIELDS: remat, attention kernel,
  # dropout bits ...) in any case.
  c.model = common.model_config(preset="base")
  c.dtype = "float32"          # compute dtype; "bfloat16" on TPU
  # Float32 finetuning keeps autodiff's attention gradients (models/softmax_dropout.py), as a checkpoint's
  # BertConfig does; "bfloat16" with dtype "bfloat16".
  c.model.attention_residuals = "float32"
  c.scan_layers = False

  # One run's hyperparameters (Devlin et al. 2019, A.3 picks them from `sweep.grid`).
  c.batch_size = 32
  c.learning_rate = 2e-5
  c.num_epochs = 3
  c.seed = 0
  c.warmup_fraction = 0.1
  # AdamW, weight decay 0.01 off LayerNorm and biases, clipping at 1.0 (bert_jax/optimizer.py). The
  # trainer sets its learning_rate, warmup_steps and total_steps from the fields above and the data size.
  c.optimizer = common.optimizer_config()
  # Layer-wise learning-rate decay (Clark et al. 2020, ELECTRA): encoder layer i (from 0) of N gets lr * decay**(N - i);
  # embeddings decay**(N + 1); heads and pooler the full rate. 1.0 = off.
  c.layerwise_lr_decay = 1.0
  # ELMo-style scalar mix of all layers (Peters et al. 2018, eq. 1) instead of the last layer;
  # with `freeze_encoder` this is BERT's feature-based approach (Devlin et al. 2019, 5.3).
  c.scalar_mix = False
  c.freeze_encoder = False

  # Evaluation, best checkpoint, early stopping.
  c.eval_every_steps = 0         # 0 = at the end of every epoch
  c.early_stopping_patience = 0  # evaluations without improvement before stopping; 0 = never
  c.keep_best_checkpoint = True
  c.write_predictions = True    # the dev predictions of the best evaluation
  c.predict_split = ""          # e.g. "test": predictions of the best checkpoint (GLUE submission files)
  c.log_every_steps = 50
  c.eval_batch_size = 0          # 0 = batch_size

  # Data parallel over every device by default (bert_jax/sharding.py).
  c.mesh = common.mesh_config()
  c.logical_axis_rules = common.LOGICAL_AXIS_RULES
  # Trials trained together (sweeps): False = each data parallel over all devices; True = one trial
  # per group of devices (the trial axis over `mesh.data`, each trial's batch over `mesh.fsdp`).
  c.trials_over_devices = False

  c.sweep = sweep_config()
  return c


def sweep_config() -> ml_collections.ConfigDict:
  """What `bert-jax sweep` varies (Devlin et al. 2019, A.3) and how it schedules trials."""
  s = ml_collections.ConfigDict()
  s.grid = ml_collections.ConfigDict()
  s.grid.batch_size = (16, 32)
  s.grid.learning_rate = (5e-5, 3e-5, 2e-5)
  s.grid.num_epochs = (2, 3, 4)
  s.seeds = (0, 1, 2)
  s.mode = "grid"             # grid | random
  s.num_random_trials = 8     # random: configurations sampled from the grid's ranges
  s.random_seed = 0
  # Successive halving: every trial first runs `halving_min_epochs`; the best 1/eta by dev metric
  # continue from their checkpoints with eta times the budget, until their full `num_epochs`.
  s.successive_halving = False
  s.halving_eta = 3
  s.halving_min_epochs = 1
  # Trials that differ only in learning rate and seed run together: parameters stacked on a
  # leading trial axis, one vmapped step; the trial axis is sharded over the devices.
  s.vmap_trials = True
  s.max_trials_per_group = 8
  return s

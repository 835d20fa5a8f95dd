"""What a pretraining config and its inputs must satisfy, checked before anything is compiled.

`validate` stops a config that cannot work (fields, kernels, the mesh against the batch and the model's
axes); `check_inputs` a run whose data or `init_from` cannot be read. Both raise `failures.UserError`
naming every problem at once (the CLI's exit 2).
"""

import math

from absl import logging
import jax
import ml_collections

from bert_jax import checkpoint_loader
from bert_jax import checkpointing
from bert_jax import failures
from bert_jax import objectives
from bert_jax import optimizer as optimizer_lib
from bert_jax import sharding
from bert_jax import steps
from bert_jax.data import masking
from bert_jax.models import dropout_key
from bert_jax.models import flash_dropout
from bert_jax.models import splash

DROPOUT_RNGS = ("threefry2x32", "rbg", "unsafe_rbg", dropout_key.NAME)


def dropout_rng(config: ml_collections.ConfigDict) -> str:
  """The dropout keys' implementation a config names (`dropout_rng`), threefry's where it has no such field."""
  return config.get("dropout_rng", DROPOUT_RNGS[0])


def validate(config: ml_collections.ConfigDict, num_devices: int | None = None) -> None:
  """Stops a config that cannot work with a clear message, before anything is compiled."""
  num_devices = jax.device_count() if num_devices is None else num_devices
  d = config.data
  objective = objectives.get(config)   # an unknown objective stops here
  try:
    cfg = objectives.encoder_config(config)   # also checks the model fields (e.g. hidden size vs heads)
  except (ValueError, TypeError) as e:   # an activation, a dtype ... the model does not know
    raise failures.UserError(f"invalid config:\n  model: {e}") from None
  problems = list(objective.validate(config)) + masking.config_problems(d)
  for field in ("global_batch_size", "log_every", "eval_every", "checkpoint_every"):
    if config[field] < 1 and (field != "eval_every" or config.eval_steps > 0):
      problems.append(f"{field} {config[field]} must be at least 1" + (" (eval_steps 0 turns evaluation off)"
                                                                       if field == "eval_every" else ""))
  checks = [lambda: steps.batch_size_warmup(config)]
  if config.optimizer.total_steps > 0:   # (said below otherwise)
    checks.append(lambda: optimizer_lib.learning_rate_schedule(config.optimizer))
  for check in checks:
    try:
      check()
    except ValueError as e:   # a schedule or a batch-size warmup that cannot be built: named with its fields
      problems.append(str(e))
  if d.seq_length > cfg.max_position_embeddings:
    problems.append(f"data.seq_length {d.seq_length} exceeds the model's {cfg.max_position_embeddings} "
                    "position embeddings (model.max_position_embeddings)")
  rate = round(d.masked_lm_prob * d.seq_length)   # the masked tokens a full sequence asks for
  if d.max_predictions_per_seq > d.seq_length:
    problems.append(f"data.max_predictions_per_seq {d.max_predictions_per_seq} > seq_length {d.seq_length}")
  elif config.get("objective", "bert") != "ltr" and d.max_predictions_per_seq < rate:
    logging.warning("data.max_predictions_per_seq %d caps the masked tokens of a full sequence below "
                    "data.masked_lm_prob %g of its %d (%d): %.3f of them are masked (google-research/bert and albert "
                    "cap it so; ALBERT's configs keep its cap of 20 at 512). Set "
                    "--config.data.max_predictions_per_seq=%d for the configured rate",
                    d.max_predictions_per_seq, d.masked_lm_prob, d.seq_length, rate,
                    d.max_predictions_per_seq / d.seq_length, rate)
  if cfg.attention_kernel.startswith("splash") and d.seq_length % splash.BLOCKS[-1]:
    problems.append(f"model.attention_kernel {cfg.attention_kernel!r} tiles sequences in blocks of "
                    f"{splash.BLOCKS[-1]} tokens: data.seq_length {d.seq_length} is no multiple (or set it to 'xla')")
  if cfg.attention_kernel.startswith("flash") and (
      problem := flash_dropout.check_length(d.seq_length, cfg.attention_dropout)):
    problems.append(f"{problem} (data.seq_length; or set model.attention_kernel to 'xla')")
  if dropout_rng(config) not in DROPOUT_RNGS:
    problems.append(f"dropout_rng {config.dropout_rng!r} is not one of {DROPOUT_RNGS}")
  if config.optimizer.name not in optimizer_lib.NAMES:
    problems.append(f"optimizer.name {config.optimizer.name!r} is not one of {optimizer_lib.NAMES}")
  if config.train_steps <= 0 or config.optimizer.total_steps <= 0:
    problems.append("train_steps and optimizer.total_steps must be positive")
  if config.get("loss_spike_factor", 0.0) > 0 and config.checkpoint_every % config.log_every:
    # A checkpoint inside a log interval holds steps the guard has not checked: a spike undone later
    # would leave it behind (a restart from it replays the skipped batches), and with keep_checkpoints 1
    # it pushes out the checkpoint the guard goes back to.
    problems.append(f"loss_spike_factor is on: checkpoint_every {config.checkpoint_every} must be a multiple of "
                    f"log_every {config.log_every}, so that checkpoints are written where the loss was checked")
  try:
    shape = dict(zip(sharding.MESH_AXES, sharding.mesh_shape(config.mesh, num_devices)))
    dcn = dict(zip(sharding.MESH_AXES, sharding.dcn_mesh_shape(config.mesh)))
    dp = math.prod(shape[a] * dcn[a] for a in sharding.BATCH_AXES)
    rows = dp * config.micro_batches
    if config.global_batch_size % rows:
      problems.append(f"global_batch_size {config.global_batch_size} is not divisible by data-parallel size "
                      f"{dp} (mesh data x fsdp) x micro_batches {config.micro_batches}")
    ways = {a: shape[a] * dcn[a] for a in sharding.MESH_AXES}
    models = [cfg] if problems else objectives.encoder_configs(config)   # ELECTRA's generator too
    rules = sharding.logical_rules(config)
    for uneven in dict.fromkeys(u for m in models for u in sharding.uneven_axes(rules, m.split_axis_sizes, ways)):
      problems.append(f"the mesh splits {uneven} unevenly, which jit refuses: choose mesh sizes that divide it, "
                      "or leave that axis unsplit in logical_axis_rules")
  except ValueError as e:
    problems.append(f"mesh: {e}")
  if config.global_batch_size % jax.process_count():
    problems.append(f"global_batch_size {config.global_batch_size} not divisible by {jax.process_count()} hosts")
  if problems:
    raise failures.UserError("invalid config:\n  " + "\n  ".join(problems))


def _not_shards(pattern: str, split: str) -> str | None:
  """What is wrong where `pattern` (data.<split>_files) gives a file that is no TFRecord shard of `prepare` (a
  corpus named in its place: read as a shard, it read as a damaged one, to be deleted); None where none is."""
  from bert_jax.data import shards  # pylint: disable=g-import-not-at-top
  raw = next((f for f in shards.shard_files(pattern, split) if not f.endswith(".tfrecord")), None)
  if raw is None:
    return None
  what = "it is" if raw == pattern else f"{raw} is"
  return (f"data.{split}_files {pattern!r}: {what} no prepared shard ({split}-*.tfrecord): name a `bert-jax "
          "prepare` output folder or a glob of its shards (a corpus is prepared first: bert-jax prepare "
          "--input=<corpus> --output_dir=DIR)")


def _vocab_problems(d: ml_collections.ConfigDict) -> list[str]:
  """`data.vocab_file` not there, or no vocabulary (a shard, a text: it stopped the run later, in a traceback)."""
  from bert_jax.data import input_pipeline  # pylint: disable=g-import-not-at-top
  if not d.vocab_file:
    return []
  if not input_pipeline.tf.io.gfile.exists(d.vocab_file):
    return [f"data.vocab_file {d.vocab_file!r} does not exist"]
  try:
    input_pipeline.load_tokenizer(d)
  except (ValueError, OSError, RuntimeError) as e:   # (SentencePiece raises RuntimeError for a damaged model)
    return [f"data.vocab_file: {e}"]
  return []


def check_inputs(config: ml_collections.ConfigDict) -> None:
  """Stops a run whose data or `init_from` cannot be read, naming the field, before anything is compiled."""
  from bert_jax.data import input_pipeline  # pylint: disable=g-import-not-at-top
  from bert_jax.data import shards  # pylint: disable=g-import-not-at-top
  d, problems = config.data, []
  if not d.train_files:
    problems.append("data.train_files is empty: set --config.data.train_files to a `bert-jax prepare` output "
                    "directory (or a glob of its shards), or to embedded:shakespeare")
  elif not d.train_files.startswith("embedded:") and not shards.shard_files(d.train_files, "train"):
    problems.append(f"data.train_files {d.train_files!r} holds no prepared shards (train-*.tfrecord): give a "
                    "`bert-jax prepare --output_dir` directory or a glob of its shards")
  elif not d.train_files.startswith("embedded:") and (raw := _not_shards(d.train_files, "train")):
    problems.append(raw)
  vocab = _vocab_problems(d)
  eval_shards = shards.shard_files(d.eval_files, "eval") if d.eval_files else []
  eval_raw = _not_shards(d.eval_files, "eval") if eval_shards else None
  if not problems and not d.train_files.startswith("embedded:") and not vocab and not eval_raw:
    problems += input_pipeline.preparation_problems(d)   # (those shards, that vocabulary: named below)
  if d.eval_files and not eval_shards:
    problems.append(f"data.eval_files {d.eval_files!r} holds no prepared shards (eval-*.tfrecord)")
  elif eval_raw:
    problems.append(eval_raw)
  problems += vocab
  if config.init_from:
    # Another family or size first: restoring it would fail late, on shapes, or succeed as another model
    # (a causal mask changes no shape).
    problem = checkpoint_loader.family_problem(config.init_from, objectives.encoder_config(config))
    if not problem and foreign(config.init_from):
      if not config.init_from_params_only:
        problem = ("a Hugging Face or Google TF checkpoint holds no optimizer state or data position: set "
                   "--config.init_from_params_only=True to start from its weights")
    elif not problem:
      problem = checkpointing.checkpoint_problem(
          config.init_from, ("state",) if config.init_from_params_only else ("state", "data"))
      problem = problem and f"{problem} (phase 2 starts from phase 1's <workdir>/checkpoints)"
    if problem:
      problems.append(f"init_from: {problem}")
  objective = objectives.get(config)
  if hasattr(objective, "input_problems"):   # what the objective itself reads (a teacher checkpoint)
    problems += objective.input_problems(config)
  if problems:
    raise failures.UserError("invalid inputs:\n  " + "\n  ".join(problems))



def foreign(path: str) -> bool:
  """Whether `init_from` is a Hugging Face or Google TF checkpoint (weights only) rather than a run's."""
  try:
    return checkpoint_loader.find(path).kind != "bert_jax"
  except (OSError, ValueError):
    return False

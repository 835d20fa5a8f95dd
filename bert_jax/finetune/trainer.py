"""The finetuning loop: `finetune(config, workdir)` for one run, `finetune_trials` for several at once.

Devlin et al. 2019, Sec. 4 and Appendix A.3: a pretrained encoder plus one new output layer, every
parameter trained with Adam (warmup over 10% of the steps, then linear decay) for a few epochs.

Trials that differ only in learning rate and seed train together: their states are stacked on a
leading trial axis and one compiled, vmapped step updates them all, each on its own shuffle of the
data. The learning rate therefore lives in the state as a per-trial scalar that multiplies the update
of an optimizer built with peak rate 1 (AdamW's update is linear in the rate). A single run is the
same code with one trial.

Workdir: `metrics.jsonl` (one JSON object per log or evaluation), `best/` (parameters of the best
evaluation, a checkpoint `init_checkpoint` accepts: two-stage finetuning), `last/` (full state when a
run stops on an epoch budget, continued by the next call), `bert_config.json`, the tokenizer,
`task.json` (the task, its options and label set: what `bert-jax predict` and `export` read),
`results.json` and the task's prediction file.

Every data file is read and checked (labels present and known, columns named, UTF-8) before the
checkpoint is loaded or anything compiles; a problem is a `readers.DataError` naming the file.
"""

import dataclasses
import functools
import glob
import math
import os
import shutil
import time

from absl import logging
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec

from bert_jax import checkpoint_loader
from bert_jax import checkpointing
from bert_jax import failures
from bert_jax import paths
from bert_jax import sharding
from bert_jax.finetune import config_checks
from bert_jax.finetune import init
from bert_jax.finetune import run_results
from bert_jax.finetune import task_model
from bert_jax.finetune import task_record
from bert_jax.finetune import tracker as tracker_lib
from bert_jax.finetune import trial_state
from bert_jax.finetune import tasks as tasks_lib

Config = ml_collections.ConfigDict
RESULTS_FILE = run_results.RESULTS_FILE   # the names callers had
raise_if_diverged = run_results.raise_if_diverged
TASK_FILE = task_record.TASK_FILE
write_task_record, read_task_record = task_record.write, task_record.read   # the names callers had
# Hyperparameters that may differ between trials trained together.
PER_TRIAL = ("learning_rate", "seed")
_Tracker = tracker_lib.Tracker   # the name callers had


# ------------------------------------------------------------------------------------------------
# Data: featurized numpy arrays, each trial its own shuffle per epoch (seed, epoch).


@dataclasses.dataclass
class _Split:
  name: str
  examples: list
  features: dict  # numpy arrays [N, ...]
  meta: dict


def _read_data(task, config: Config, tokenizer):
  """(task with its label set, train, the dev splits, and the `predict_split` or None), every file read and
  checked.

  The dev splits: `eval_split` (default the task's first), which picks the best checkpoint and stops early,
  then the task's other dev splits (MNLI's mismatched beside its matched), evaluated beside it. The label
  set of generic tasks is the training file's; dev labels must be among it.
  """
  def read(split, limit=0):
    return task.read(split, config.data_dir)[:limit or None], task.file(split, config.data_dir)

  def featurize(split, examples, training=False):
    # Training, a span task drops the questions whose answer is not in their context, as run_squad.py
    # does: their target would read "no answer". The other kinds take no such option.
    return _Split(split, examples, *task.featurize(examples, tokenizer, config.max_seq_length, is_training=training))

  train_examples, train_file = read(config.train_split, config.max_train_examples)
  task = task.with_labels_from(train_examples, train_file)
  dev_split = config.eval_split or task.dev_splits[0]
  devs = []
  for split in [dev_split] + [s for s in task.dev_splits if s != dev_split and dev_split in task.dev_splits]:
    examples, file = read(split, config.max_eval_examples)
    task.check_labelled(examples, file)
    if os.path.isfile(config.data_dir) and file == train_file:   # data_dir names one file: every split's
      logging.warning("%s is both the training file and the %s file (data_dir names a file, not a directory "
                      "holding train and dev files): the %s metrics, and the best checkpoint they choose, are "
                      "the training data's", file, split, split)
    devs.append(featurize(split, examples))
  to_predict = None
  if config.predict_split and config.keep_best_checkpoint:
    to_predict = featurize(config.predict_split, read(config.predict_split)[0])
  return task, featurize(config.train_split, train_examples, training=True), devs, to_predict


def _train_batches(features: dict, seeds, epoch: int, batch_size: int, skip: int):
  """Host batches [T, B, ...] of one epoch from step `skip` on; trial t reads its own permutation."""
  n = len(features["input_ids"])
  perms = [np.random.default_rng([int(s), epoch]).permutation(n) for s in seeds]
  for i in range(skip, n // batch_size):
    rows = np.stack([p[i * batch_size:(i + 1) * batch_size] for p in perms])
    yield {k: v[rows] for k, v in features.items()}


def _global(host_batch: dict, sharded: NamedSharding, batch_axis: int) -> dict:
  """Global arrays from the full host batch: every process contributes its share of the rows."""
  n, i = jax.process_count(), jax.process_index()
  def one(v):
    rows = v.shape[batch_axis] // n
    local = np.take(v, np.arange(i * rows, (i + 1) * rows), axis=batch_axis)
    return jax.make_array_from_process_local_data(sharded, local, v.shape)
  return {k: one(v) for k, v in host_batch.items()}


def _predict(pred_fn, params, features: dict, batch_size: int, sharded) -> list:
  """Model outputs on every feature, per trial: [T] trees of [N, ...] numpy (padding rows dropped)."""
  n, chunks = len(features["input_ids"]), []
  for start in range(0, n, batch_size):
    rows = np.arange(start, start + batch_size)
    real = min(batch_size, n - start)
    rows[real:] = 0  # pad the last batch with copies of row 0
    out = pred_fn(params, _global({k: v[rows] for k, v in features.items()}, sharded, batch_axis=0))
    out = multihost_utils.process_allgather(out, tiled=True)
    chunks.append(jax.tree.map(lambda x: np.asarray(x)[:, :real], out))
  outputs = jax.tree.map(lambda *xs: np.concatenate(xs, axis=1), *chunks)
  return [trial_state.trial(outputs, t) for t in range(len(jax.tree.leaves(outputs)[0]))]


_PREDICTION_EXTENSIONS = {"span": "json", "tagging": "txt", "": "tsv"}   # by the task's kind, else tsv


def _prediction_file(task, split: str) -> str:
  return f"predictions_{split}." + _PREDICTION_EXTENSIONS.get(task.kind, _PREDICTION_EXTENSIONS[""])


def prediction_files(workdir: str) -> list[str]:
  """The prediction files a run wrote into `workdir` (`_prediction_file`'s names)."""
  return sorted(p for ext in set(_PREDICTION_EXTENSIONS.values())
                for p in glob.glob(os.path.join(glob.escape(workdir), f"predictions_*.{ext}")))


# ------------------------------------------------------------------------------------------------
# The loop.


def finetune(config: Config, workdir: str, *, max_epochs: int | None = None) -> dict:
  """Finetunes one model (see `finetune_trials`); returns its results dict."""
  return finetune_trials([config], [workdir], max_epochs=max_epochs)[0]


def _check_group(configs) -> None:
  strip = lambda c: {k: v for k, v in c.to_dict().items() if k not in PER_TRIAL + ("sweep",)}
  for c in configs[1:]:
    if strip(c) != strip(configs[0]):
      diff = sorted(k for k, v in strip(configs[0]).items() if strip(c).get(k) != v)
      raise failures.UserError(f"trials trained together may differ only in {PER_TRIAL}, not in {diff}")


def finetune_trials(configs: list, workdirs: list, *, max_epochs: int | None = None,
                    names: list[str] | None = None) -> list:
  """Finetunes len(configs) trials at once on the same data (each its own learning rate and seed).

  Args:
    configs: finetuning configs (configs/finetune/common.py) differing only in `PER_TRIAL` fields.
    workdirs: one directory per trial.
    max_epochs: stop after this many epochs in total (successive halving's budget), leaving the full
      state in `last/`; a later call with a larger budget continues from it. None: `num_epochs`.
    names: each trial's name (a sweep's): every trial prints its progress, each line after its name. None: one
      trial prints its own, trials trained together none (their files have it).
  Returns:
    One results dict per trial (also `<workdir>/results.json`).
  """
  for c in configs:   # before anything is read
    config_checks.validate(c)
  # Orbax and every writer get absolute paths, whatever the caller typed (paths.py).
  workdirs = [paths.absolute(w) for w in workdirs]
  configs = [paths.absolute_config(c.copy_and_resolve_references(), paths.FINETUNE_FIELDS) for c in configs]
  _check_group(configs)
  config = configs[0]
  task, tokenizer, (train, devs, to_predict), (bert_cfg, encoder_params) = _task_and_encoder(config)
  mesh = sharding.create_mesh(config.mesh)
  rules, trial_axis, batch_axes = _layout(config, mesh, len(configs), bert_cfg)
  schedule = _Schedule.of(config, len(train.features["input_ids"]), max_epochs)
  model = task_model.build_model(bert_cfg, task, config.scalar_mix)
  tx = task_model.build_optimizer(config, schedule.total_steps, bert_cfg.num_layers)
  trackers = _start_trials(workdirs, config, task, bert_cfg, tokenizer, names)
  batch_sharding = NamedSharding(mesh, PartitionSpec(trial_axis, batch_axes))
  eval_sharding = NamedSharding(mesh, PartitionSpec(batch_axes))
  eval_batch_size = config.eval_batch_size or config.batch_size
  t0 = time.time()
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    state, shardings = trial_state.init_state(model, tx, configs, encoder_params, mesh, rules, config.max_seq_length,
                                              trial_axis)
    restored = trial_state.restore_last(state, shardings, workdirs)
    state = state if restored is None else restored
    step_fn, pred_fn = _jitted_steps(model, tx, task, config, shardings, batch_sharding)
    evaluate = functools.partial(_evaluate, pred_fn, task=task, trackers=trackers, devs=devs, config=config,
                                 batch_size=eval_batch_size, sharded=eval_sharding)
    state, step = _train(step_fn, state, train.features, configs, schedule, trackers, evaluate, batch_sharding, t0)
    finished = step >= schedule.total_steps or all(t.stopped for t in trackers)
    if finished and to_predict is not None:
      _predict_with_best(pred_fn, task, to_predict, trackers, eval_batch_size, eval_sharding)
  for w in workdirs:  # a finished run must not be "continued" from an older budget's state
    shutil.rmtree(os.path.join(w, "last"), ignore_errors=True)
  if not finished:
    trial_state.save_last(state, workdirs)
  return [run_results.write(tr, c, task, step, schedule.steps_per_epoch, schedule.total_steps,
                            finished or tr.stopped, time.time() - t0) for tr, c in zip(trackers, configs)]


def _task_and_encoder(config: Config) -> tuple:
  """(task, tokenizer, its data as `_read_data` gives it, (encoder config, encoder params)): every data file
  is read and checked before the checkpoint is loaded."""
  try:
    task = tasks_lib.get_task(config.task, **config.task_opts)
  except failures.UserError:
    raise
  except ValueError as e:   # an unknown task or task option
    raise failures.UserError(f"config.task {config.task!r}: {e}") from None
  tokenizer = init.load_tokenizer(config)
  task, *data = _read_data(task, config, tokenizer)
  bert_cfg, encoder_params = init.load_encoder(config)
  if tokenizer.vocab_size > bert_cfg.vocab_size:   # an id past the embedding table trains on NaN
    raise failures.UserError(
        f"the tokenizer of {config.vocab_file or config.init_checkpoint} ({tokenizer.source_file}) has "
        f"{tokenizer.vocab_size} tokens but the model's embedding table has {bert_cfg.vocab_size}: use the "
        "checkpoint's own vocabulary (leave config.vocab_file unset) or the one it was pretrained with")
  if config.max_seq_length > bert_cfg.max_input_length:
    raise failures.UserError(f"max_seq_length {config.max_seq_length} is longer than the model's position table "
                             f"holds ({bert_cfg.max_input_length} tokens, max_position_embeddings): set "
                             f"--config.max_seq_length={bert_cfg.max_input_length} or less")
  if task.kind in ("classification", "regression"):   # the pooling goes into task.json with the task's options
    task = dataclasses.replace(task, options={**task.options,
                                              "classifier_pooling": init.classifier_pooling(config, bert_cfg)})
  return task, tokenizer, tuple(data), (bert_cfg, encoder_params)


def _start_trials(workdirs: list, config: Config, task, bert_cfg, tokenizer, names: list[str] | None) -> list:
  """Each trial's records beside its checkpoints (model config, vocabulary, lower-casing and the task: what
  checkpoint_loader and `predict` read back) and its tracker. Named trials (a sweep's) print their progress, each
  line after its name; else one trial prints its own, and trials trained together log to their files only."""
  for w in workdirs:
    checkpoint_loader.write_run_record(w, bert_cfg, tokenizer.source_file, tokenizer.do_lower_case)
    task_record.write(w, task, config)
  echo = names is not None or len(workdirs) == 1
  return [tracker_lib.Tracker(w, task.primary_metric, config.early_stopping_patience, echo=echo, name=name)
          for w, name in zip(workdirs, names or [""] * len(workdirs))]


def _jitted_steps(model, tx, task, config: Config, shardings, batch_sharding) -> tuple:
  """The trials' train step (vmapped over the trial axis; the state donated, the losses replicated) and
  prediction step (a batch shared by every trial), jitted."""
  step_fn = jax.jit(jax.vmap(functools.partial(task_model.train_step, model=model, tx=tx, kind=task.kind,
                                               freeze_encoder=config.freeze_encoder)),
                    in_shardings=(shardings, batch_sharding), donate_argnums=0,
                    out_shardings=(shardings, NamedSharding(batch_sharding.mesh, PartitionSpec())))
  pred_fn = jax.jit(jax.vmap(functools.partial(task_model.predict_step, model=model), in_axes=(0, None)))
  return step_fn, pred_fn


def _layout(config: Config, mesh, trials: int, bert_cfg) -> tuple:
  """(logical axis rules, the trial axis, the batch axes) of `trial_state.layout`, once the mesh is known to
  split the encoder's axes and the batch evenly."""
  rules, trial_axis, batch_axes = trial_state.layout(config, mesh, trials)
  if uneven := sharding.uneven_axes(rules, bert_cfg.split_axis_sizes, mesh.shape):
    raise failures.UserError(f"the mesh {dict(mesh.shape)} splits the encoder's {', '.join(uneven)} unevenly, "
                             "which jit refuses: choose mesh sizes that divide it")
  if config.batch_size % math.prod(mesh.shape[a] for a in batch_axes):
    raise failures.UserError(f"batch_size {config.batch_size} does not split over the mesh axes {batch_axes}")
  return rules, trial_axis, batch_axes


@dataclasses.dataclass(frozen=True)
class _Schedule:
  """Where a call's steps go: `num_epochs` of whole batches, evaluated every `eval_every` steps, this call
  stopping at `budget` (the steps of `max_epochs`, or all of them)."""
  steps_per_epoch: int
  total_steps: int
  budget: int
  eval_every: int

  @classmethod
  def of(cls, config: Config, examples: int, max_epochs: int | None) -> "_Schedule":
    steps_per_epoch = examples // config.batch_size
    if not steps_per_epoch:
      raise failures.UserError(f"{examples} training examples, fewer than batch_size {config.batch_size}: lower "
                               "--config.batch_size or give more data")
    total_steps = steps_per_epoch * config.num_epochs
    budget = total_steps if max_epochs is None else min(total_steps, steps_per_epoch * max_epochs)
    return cls(steps_per_epoch, total_steps, budget, config.eval_every_steps or steps_per_epoch)


def _train(step_fn, state, features: dict, configs: list, schedule: _Schedule, trackers: list, evaluate,
           batch_sharding, t0: float) -> tuple:
  """Trains the stacked trials from their state's step to the schedule's budget, or until every trial has
  stopped early; logs their losses and evaluates them on the way. Returns (state, step)."""
  config = configs[0]
  step = int(jax.device_get(state["step"])[0])
  loss_sum, summed = jnp.zeros(len(configs)), 0   # the steps summed since the last log, in this call
  while step < schedule.budget and not all(t.stopped for t in trackers):
    epoch, skip = divmod(step, schedule.steps_per_epoch)
    for host_batch in _train_batches(features, [c.seed for c in configs], epoch, config.batch_size, skip):
      state, sums = step_fn(state, _global(host_batch, batch_sharding, batch_axis=1))
      loss_sum, summed = loss_sum + sums["loss_sum"] / jnp.maximum(sums["weight"], 1.0), summed + 1
      step += 1
      if step % config.log_every_steps == 0:
        losses = np.asarray(loss_sum) / summed  # the only host sync between evals
        for t, tracker in enumerate(trackers):
          if not tracker.stopped:   # a stopped trial's slot trains on with its group: not its curve
            tracker.log(step, {"epoch": step / schedule.steps_per_epoch, "train/loss": float(losses[t]),
                               "time_s": round(time.time() - t0, 1)})
            if not math.isfinite(losses[t]):
              tracker.diverge(step)
        loss_sum, summed = jnp.zeros(len(configs)), 0
      if step % schedule.eval_every == 0 or step == schedule.total_steps:
        evaluate(state, step)
      elif step == schedule.budget:   # a rung's score; the run continued later evaluates as one that never stopped
        evaluate(state, step, peek=True)
      if step >= schedule.budget or all(t.stopped for t in trackers):
        break
  return state, step


def _evaluate(pred_fn, state, step, *, task, trackers, devs: list, batch_size, sharded, config,
              peek: bool = False) -> None:
  """Every dev split; the first's metrics decide the best checkpoint and early stopping, the others' are
  logged and kept beside them as `<split>/<metric>`. `peek`: at an epoch budget between evaluations, only
  logged (`budget_eval/...`) and kept as the trial's score at the budget (`Tracker.peeked`)."""
  dev, others = devs[0], devs[1:]
  finite = np.asarray(_finite_per_trial(state["params"]))   # a last update to NaN leaves the loss it logged finite
  for t, tracker in enumerate(trackers):
    if not tracker.stopped and not finite[t]:
      tracker.diverge(step)
  outputs = _predict(pred_fn, state["params"], dev.features, batch_size, sharded)
  other_outputs = [_predict(pred_fn, state["params"], o.features, batch_size, sharded) for o in others]
  for t, tracker in enumerate(trackers):
    if tracker.stopped:
      continue  # an early-stopped trial keeps its results; its slot still trains with the group

    def on_best(t=t, tracker=tracker):
      if config.keep_best_checkpoint:
        ckpt = checkpointing.Checkpointer(os.path.join(tracker.workdir, "best"), keep=1, async_save=False)
        ckpt.save(step, {"params": trial_state.trial(state["params"], t)})
        ckpt.close()
      if config.write_predictions:
        for split, out in zip(devs, [outputs] + other_outputs):
          task.write_predictions(os.path.join(tracker.workdir, _prediction_file(task, split.name)), out[t],
                                 split.examples, split.meta)

    metrics = task.evaluate(outputs[t], dev.examples, dev.meta)
    for split, out in zip(others, other_outputs):
      metrics.update({f"{split.name}/{k}": v for k, v in task.evaluate(out[t], split.examples, split.meta).items()})
    if peek:
      tracker.peeked(step, metrics)
    else:
      tracker.evaluated(step, metrics, on_best)


@jax.jit
def _finite_per_trial(params) -> jax.Array:
  """[T] bool: whether every parameter of each trial (the leading axis) is finite."""
  return jnp.stack([jnp.isfinite(x).all(axis=tuple(range(1, x.ndim))) for x in jax.tree.leaves(params)]).all(0)


def _predict_with_best(pred_fn, task, split: _Split, trackers, batch_size, sharded) -> None:
  """Prediction files for `split` (e.g. GLUE test: the submission TSVs) from each trial's best/; a trial that
  diverged before its first evaluation has none, and writes none."""
  has_best = [t.best_step >= 0 for t in trackers]
  if not any(has_best):
    return
  best = {i: checkpointing.restore_params(os.path.join(t.workdir, "best")) for i, t in enumerate(trackers)
          if has_best[i]}
  stand_in = best[has_best.index(True)]   # the trial axis keeps its length: the compiled step's layout
  stacked = jax.tree.map(lambda *xs: np.stack(xs), *[best.get(i, stand_in) for i in range(len(trackers))])
  outputs = _predict(pred_fn, stacked, split.features, batch_size, sharded)
  for tracker, out in ((t, o) for t, o, b in zip(trackers, outputs, has_best) if b):
    task.write_predictions(os.path.join(tracker.workdir, _prediction_file(task, split.name)), out,
                           split.examples, split.meta)

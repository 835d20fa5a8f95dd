"""Pretraining: the loop (`train_and_evaluate`), the CLI's one call, on the sharded setup of train_setup.py.

    bert-jax pretrain --config=configs/tiny.py --workdir=/tmp/bert_tiny
"""

import collections
import contextlib
import dataclasses
import os
import time
from typing import Any

from absl import logging
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bert_jax import checkpoint_loader
from bert_jax import checkpointing
from bert_jax import config_record
from bert_jax import curves
from bert_jax import failures
from bert_jax import metrics_writer
from bert_jax import objectives
from bert_jax import paths
from bert_jax import preemption
from bert_jax import pretrain_data
from bert_jax import run_checks
from bert_jax import sharding
from bert_jax import steps
from bert_jax import train_setup
from bert_jax.models import library_matmul

TrainState = steps.TrainState
bert_config = objectives.encoder_config   # the encoder a pretraining config describes
DROPOUT_RNGS = run_checks.DROPOUT_RNGS
validate = run_checks.validate          # the config, before anything is compiled
check_inputs = run_checks.check_inputs  # its data and init_from
prepared_data_config = pretrain_data.prepared_data_config
load_tokenizer = pretrain_data.load_tokenizer
create_iterator = pretrain_data.create_iterator   # looked up here by the loop: tests wrap it


# ---------------------------------------------------------------------------------------------
# State, evaluation, metrics
# ---------------------------------------------------------------------------------------------


def restore_or_init(s: train_setup.Setup, config, checkpointer: checkpointing.Checkpointer, train_iter, rng):
  """The run's latest checkpoint (state and data position), else `config.init_from`, else fresh."""
  state, data_state, step = checkpointer.restore_latest(s.abstract_state)   # skips unreadable steps
  if step is not None:
    train_iter.set_state(data_state)
    return state, f"resumed from {checkpointer.directory}/{step}"
  state = s.init(rng)
  if s.init_params is not None and not config.init_from:
    return state.replace(params=s.init_params(state.params, s.frozen)), "initialized from the frozen variables"
  if config.init_from:
    if run_checks.foreign(config.init_from):
      state = state.replace(params=_params_from(config, state.params, s))
    elif config.init_from_params_only:
      params = checkpointing.restore_params(config.init_from, s.abstract_state.params)
      state = state.replace(params=params)
    else:
      state = checkpointing.restore_state(config.init_from, s.abstract_state)
    return state, f"initialized from {config.init_from} (params only: {config.init_from_params_only})"
  return state, "initialized from scratch"


def _params_from(config, fresh: dict, s: train_setup.Setup) -> dict:
  """`fresh` with every part a Hugging Face or TF checkpoint holds ("bert", "mlm", "nsp", ...) read from it;
  the parts it lacks (a pooler, an MLM head saved without) stay freshly initialised. Shapes must match.
  The fresh params stay where they are (on several hosts no process can fetch them all); each loaded leaf
  is put on the mesh from the host."""
  path = config.init_from
  _, loaded = checkpoint_loader.load_model(path, scan_layers=bert_config(config).scan_layers)

  def merge(ours, theirs, shardings, where):
    if isinstance(ours, dict):
      return {k: merge(v, theirs[k], shardings[k], f"{where}/{k}") if isinstance(theirs, dict) and k in theirs
              else v for k, v in ours.items()}
    if np.shape(theirs) != tuple(ours.shape):
      raise ValueError(f"init_from {path!r}: {where} has shape {np.shape(theirs)}, the model {tuple(ours.shape)}")
    return train_setup.put_sharded(np.asarray(theirs).astype(ours.dtype), shardings)

  kept = sorted(k for k in fresh if k not in loaded)
  if kept:
    _say(f"init_from {path}: {', '.join(kept)} newly initialised (not in the checkpoint)")
  return merge(fresh, loaded, s.state_shardings.params, "params")


def evaluate(s: train_setup.Setup, eval_iter, eval_start: dict, params) -> dict[str, float]:
  """Loss sums over the held-out batches of `eval_iter`, replayed from `eval_start` every time.

  Also `eval/unigram_accuracy`: the accuracy of always predicting the most frequent target of these
  very batches (their majority class, counted on this host's rows): the plateau a model that ignores
  the context reaches, measured on the same data.
  """
  eval_iter.set_state(eval_start)
  totals, counts = None, collections.Counter()
  for host_batch in eval_iter:
    sums = s.eval_step(params, sharding.global_batch(host_batch, s.mesh))
    totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
    targets, weights = s.objective.prediction_targets(host_batch)
    counts.update(np.asarray(targets)[np.asarray(weights) > 0].tolist())
  if totals is None:
    return {}
  scalars = s.objective.summarize("eval", jax.device_get(totals))
  if counts:
    scalars["eval/unigram_accuracy"] = max(counts.values()) / sum(counts.values())
  return scalars


def _accumulate(interval: dict, metrics: dict) -> dict:
  """Sums of the step metrics over a log interval; the longest non-finite streak in it."""
  return {k: (jnp.maximum if k == "nonfinite_streak" else jnp.add)(interval[k], v) for k, v in metrics.items()}


def _check_finite(scalars: dict, config, step: int, checkpointer: checkpointing.Checkpointer) -> None:
  """The non-finite guard's stop: `max_nonfinite_steps` skipped steps in a row within a log interval."""
  streak = scalars.get("train/nonfinite_streak", 0)
  if streak >= config.max_nonfinite_steps:
    raise failures.Diverged(
        f"stopping at step {step}: {streak} steps in a row had a non-finite loss, gradient or update (skipped, "
        f"{scalars['train/nonfinite_count']} in total). {_last_good(checkpointer)} Lower "
        "optimizer.learning_rate, raise optimizer.eps if it is 0, or check the data.")


def _last_good(checkpointer: checkpointing.Checkpointer) -> str:
  """Where a restart would resume: no checkpoint is written inside a non-finite streak."""
  try:
    checkpointer.check(wait=True)
  except failures.SaveFailed as e:
    return f"The last save failed ({e})."
  latest = checkpointer.latest_step()
  if latest is None:
    return "No checkpoint was written yet: a restart starts from the beginning (or init_from)."
  return f"The last good checkpoint is {checkpointer.directory}/{latest}; a restart resumes from it."


def _save(checkpointer: checkpointing.Checkpointer, step: int, state: TrainState, train_iter) -> bool:
  """Saves unless the state is inside a non-finite streak (its parameters are those before the streak,
  but a restart from it would replay the steps that failed)."""
  streak = int(state.nonfinite_streak)   # a host sync, at save steps only
  if streak:
    _say(f"not saving step {step}: it ends a streak of {streak} non-finite steps. {_last_good(checkpointer)}")
    return False
  checkpointer.save(step, state, train_iter.get_state())
  return True


def _train_scalars(objective, interval: dict, last: dict, num_steps: int) -> dict[str, float]:
  """Interval means of the summed step metrics; the schedule and counters as of the last step."""
  scalars = objective.summarize("train", interval)
  scalars.update({"train/loss": float(interval["loss"]) / num_steps,
                  "train/grad_norm": float(interval["grad_norm"]) / num_steps,
                  "train/learning_rate": float(last["learning_rate"]),
                  "train/nonfinite_count": int(last["nonfinite_count"]),
                  "train/nonfinite_streak": int(interval["nonfinite_streak"])})   # longest in the interval
  return scalars


def _perf_scalars(config, num_steps: int, seconds: float, step: int, flops: float) -> dict[str, float]:
  steps_per_sec = num_steps / max(seconds, 1e-9)
  perf = {"perf/steps_per_sec": steps_per_sec,
          "perf/tokens_per_sec": steps_per_sec * config.global_batch_size * config.data.seq_length,
          "perf/eta_s": (config.train_steps - step) / steps_per_sec}
  if config.peak_flops_per_device > 0:
    perf["perf/mfu"] = flops * steps_per_sec / (config.peak_flops_per_device * jax.device_count())
  return perf


# ---------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Trains until `config.train_steps` (or SIGTERM), resuming from `<workdir>/checkpoints` if any.

  Returns the scalars of the last log step and evaluation.
  """
  return train_to_end(config, workdir)[0]


def train_to_end(config: ml_collections.ConfigDict, workdir: str) -> tuple[dict[str, float], int]:
  """`train_and_evaluate`, and the step the run ended at: below `train_steps` where SIGTERM or Ctrl-C stopped it
  (`bert-jax pretrain` then exits with `failures.STOPPED`)."""
  run, state, origin = _start(config, workdir)
  step = int(state.step)   # the one host sync before the loop: a host-side step counter from here on
  _say(f"mesh {dict(run.s.mesh.shape)} over {jax.device_count()} devices; {origin} at step {step}; "
       f"training to step {run.config.train_steps}")
  if (hint := library_matmul.matmuls_hint(bert_config(run.config), run.s.mesh)) is not None:
    _say(hint)
  writer, watcher = metrics_writer.MetricWriter(run.workdir, from_step=step), preemption.Watcher()
  peer_lost = False
  try:
    state, step, results, evaluated_at = _loop(run, state, step, writer, watcher)
  except failures.PeerLost:
    peer_lost = True   # closing would wait for the lost host in a barrier
    raise
  finally:
    if not peer_lost:
      run.checkpointer.close()
      writer.close()
      watcher.close()
  done = (failures.cut_short_by_sigterm("bert-jax pretrain", f"the run is done at step {step}, its checkpoint and "
                                       f"metrics saved in {run.workdir}; its report was cut short")
          if step >= run.config.train_steps else contextlib.nullcontext())
  with done:   # done and saved: a SIGTERM now cuts the report short, the run stays done
    _report(run, state, step, results, evaluated_at)
  return results, step


@dataclasses.dataclass
class _Run:
  """What a pretraining run holds from its setup to its last report."""
  config: ml_collections.ConfigDict   # with absolute paths
  workdir: str                        # absolute
  s: train_setup.Setup
  tokenizer: Any
  checkpointer: checkpointing.Checkpointer
  train_iter: Any
  eval_iter: Any                      # None without evaluation
  eval_start: dict | None             # where every evaluation replays the held-out batches from
  dropout_rng: jax.Array


def _start(config: ml_collections.ConfigDict, workdir: str) -> tuple[_Run, TrainState, str]:
  """The checked config, the data, the sharded setup and the state to start from: the run's latest
  checkpoint, else `init_from`, else fresh (and where it came from, in words)."""
  # Orbax and every writer get absolute paths, whatever the caller typed (paths.py).
  workdir = paths.absolute(workdir)
  config = paths.absolute_config(config.copy_and_resolve_references(), paths.PRETRAIN_FIELDS)
  validate(config)
  check_inputs(config)
  config_record.check_workdir_kind(workdir, "pretraining")
  checkpoint_loader.check_run_model(workdir, bert_config(config))
  os.makedirs(workdir, exist_ok=True)
  mesh = sharding.create_mesh(config.mesh)
  data_config = prepared_data_config(config, workdir)
  tokenizer = load_tokenizer(data_config, config)
  # The data before the model: a split too small for its format stops here, before anything is compiled.
  train_iter = create_iterator(data_config, config, "train", tokenizer)
  eval_iter = create_iterator(data_config, config, "eval", tokenizer) if config.eval_steps > 0 else None
  s = train_setup.load_frozen(train_setup.setup(config, mesh))
  init_rng, dropout_rng = train_setup.rngs(config)
  checkpointer = checkpointing.Checkpointer(os.path.join(workdir, "checkpoints"), keep=config.keep_checkpoints,
                                            async_save=config.async_checkpointing)
  eval_start = eval_iter.get_state() if eval_iter is not None else None
  state, origin = restore_or_init(s, config, checkpointer, train_iter, init_rng)
  # The model config and tokenizer beside the checkpoints (embed, fill-mask and finetune read them), once the
  # checkpoints there are known to be this run's: a refused start leaves another run's record as it was.
  checkpoint_loader.write_run_record(workdir, bert_config(config), tokenizer.source_file, tokenizer.do_lower_case)
  run = _Run(config, workdir, s, tokenizer, checkpointer, train_iter, eval_iter, eval_start, dropout_rng)
  return run, state, origin


def _loop(run: _Run, state: TrainState, step: int, writer,
          watcher) -> tuple[TrainState, int, dict[str, float], int | None]:
  """Steps from `step` to `train_steps`, or to the step all hosts agree on after SIGTERM: logs and evaluates,
  goes back over a loss spike, checkpoints. Returns the state, its step, the scalars last written and the step
  of the last evaluation among them (None: none).

  A failed collective in a job of several processes raises `failures.PeerLost`.
  """
  config = run.config
  interval = _Interval(objectives.train_flops_per_step(config))
  spikes = failures.LossSpikeGuard(config.loss_spike_factor, config.max_loss_spikes)
  results, evaluated_at = {}, None
  try:
    while step < config.train_steps:
      if interval.sums is None:
        spikes.start_interval(step + 1, run.train_iter)
      state, metrics = _train_step(run, state, step, spikes)
      step += 1
      interval.add(metrics)
      scalars, spiked = _scalars(run, state, step, interval, metrics, spikes)
      if scalars:
        writer.write(step, scalars)
        results.update(scalars)
        evaluated_at = step if any(k.startswith("eval/") for k in scalars) else evaluated_at
      _check_finite(scalars, config, step, run.checkpointer)
      state, step, preempted = _undo_spike_or_save(run, state, step, scalars, spiked, spikes, writer, watcher)
      if preempted:
        break
      if interval.sums is None:   # just logged: time the next interval from here, after eval and saving
        interval.mark = time.time()
  except jax.errors.JaxRuntimeError as e:
    if jax.process_count() == 1:
      raise
    raise failures.PeerLost(
        f"a collective failed after step {step} ({str(e).splitlines()[0][:300]}): another host of the job "
        f"has died. Exiting with code {failures.RESTART} so that the supervisor restarts the whole job; it "
        f"resumes from {run.checkpointer.directory}/{run.checkpointer.latest_step()}.") from e
  return state, step, results, evaluated_at


def _train_step(run: _Run, state: TrainState, step: int, spikes: failures.LossSpikeGuard):
  """The step after `step`, with no host sync: its metrics stay on device until a log step. The profiler
  traces `profile_steps` steps from `profile_start_step`."""
  config = run.config
  if step == config.profile_start_step:
    jax.profiler.start_trace(os.path.join(run.workdir, "profile"))
  batch = sharding.global_batch(spikes.next_batch(run.train_iter), run.s.mesh)
  state, metrics = run.s.train_step(state, batch, run.dropout_rng)
  run.checkpointer.check()   # a save that failed in the background stops the run here, not at the next save
  if config.profile_start_step >= 0 and step + 1 == config.profile_start_step + config.profile_steps:
    jax.block_until_ready(state)
    jax.profiler.stop_trace()
  return state, metrics


class _Interval:
  """The step metrics summed on device since the last log (no host sync per step), and when it began."""

  def __init__(self, flops_per_step: float):
    self.flops, self.sums, self.steps, self.mark = flops_per_step, None, 0, time.time()

  def add(self, metrics: dict) -> None:
    self.sums = metrics if self.sums is None else _accumulate(self.sums, metrics)
    self.steps += 1

  def scalars(self, run: _Run, last: dict, step: int) -> dict[str, float]:
    """Its means and throughput, one host sync; it is empty again after."""
    sums, last = jax.device_get((self.sums, last))
    scalars = _train_scalars(run.s.objective, sums, last, self.steps)
    scalars.update(_perf_scalars(run.config, self.steps, time.time() - self.mark, step, self.flops))
    self.sums, self.steps = None, 0
    return scalars


def _scalars(run: _Run, state: TrainState, step: int, interval: _Interval, metrics: dict,
             spikes: failures.LossSpikeGuard) -> tuple[dict[str, float], bool]:
  """The scalars due at `step`, one metrics object: the interval's means, throughput and the spike guard's
  counters at a log step, the held-out scores at an eval step. Also whether the interval's loss spiked."""
  config, scalars, spiked = run.config, {}, False
  last_step = step == config.train_steps
  if step % config.log_every == 0 or last_step:
    scalars.update(interval.scalars(run, metrics, step))
    spiked = spikes.is_spike(scalars["train/loss"])
    scalars.update(spikes.scalars())   # counters, when the guard is on
  if config.eval_steps > 0 and (step % config.eval_every == 0 or last_step):
    scalars.update(evaluate(run.s, run.eval_iter, run.eval_start, state.params))
  return scalars, spiked


def _undo_spike_or_save(run: _Run, state: TrainState, step: int, scalars: dict, spiked: bool,
                        spikes: failures.LossSpikeGuard, writer, watcher) -> tuple[TrainState, int, bool]:
  """After a spike, the last checkpoint before its interval (whose batches are then skipped); else a
  checkpoint where one is due: periodically, at the end, and at the step all hosts agree on after SIGTERM.
  Returns (state, step, whether the run was preempted)."""
  config, rolled_back = run.config, False
  if spiked:
    undone, message = spikes.undo(run.checkpointer, run.s.abstract_state, run.train_iter, step, scalars["train/loss"])
    _say(message)
    writer.write(step, spikes.scalars())
    rolled_back = undone is not None
    state, step = undone or (state, step)
  preempted = watcher.reached(step)
  # A spike that found no checkpoint to go back to goes on: its state is saved as any other.
  saved = not rolled_back and (step % config.checkpoint_every == 0 or step == config.train_steps
                               or preempted) and _save(run.checkpointer, step, state, run.train_iter)
  if preempted:
    _say(f"preempted: saved checkpoint at step {step}, exiting" if saved else
         f"preempted at step {step}: {_last_good(run.checkpointer)} Exiting")
  return state, step, preempted


def _report(run: _Run, state: TrainState, step: int, results: dict[str, float], evaluated_at: int | None) -> None:
  """The run's last lines: the curves, a fill-mask preview on held-out lines, the held-out accuracy
  against the unigram baseline's, and where the checkpoint and metrics are."""
  config, s = run.config, run.s
  shown = {k: round(v, 4) for k, v in results.items() if k.startswith("eval/")}
  plot = (curves.plot_pretraining(run.workdir, term=next(iter(s.objective.LOSS_TERMS)))
          if jax.process_index() == 0 else None)
  if (run.eval_iter is not None and config.fill_mask_examples > 0 and jax.process_count() == 1
      and s.objective.HAS_MLM_HEAD and not bert_config(config).causal):   # fill-mask refuses a causal model
    from bert_jax.tools import fill_mask  # pylint: disable=g-import-not-at-top
    _say(f"fill-mask on held-out lines at step {step}:\n" + fill_mask.held_out_examples(
        bert_config(config), state.params, run.tokenizer, run.eval_iter, run.eval_start, config.fill_mask_examples))
  if "eval/mlm_accuracy" in results:
    _say(f"held-out MLM accuracy {results['eval/mlm_accuracy']:.3f}; always predicting the most frequent "
         f"held-out target: {results['eval/unigram_accuracy']:.3f}")
  ended = (f"done at step {step}" if step >= config.train_steps else
           f"stopped at step {step} of {config.train_steps} (the same command resumes)")
  if shown and evaluated_at != step:   # a stopped run's last evaluation came before its last step
    shown = f"held-out at step {evaluated_at}: {shown}"
  _say(f"{ended}{f': {shown}' if shown else ''}; checkpoint "
       f"{run.checkpointer.directory}/{run.checkpointer.latest_step()}, "
       f"metrics {run.workdir}/metrics.jsonl, TensorBoard {run.workdir}/tensorboard, curves {plot}")


def _say(message: str) -> None:
  """Progress for the person at the terminal (process 0 only), whatever the log verbosity."""
  logging.info(message)
  if jax.process_index() == 0:
    print(message, flush=True)

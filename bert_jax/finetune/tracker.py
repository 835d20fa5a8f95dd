"""One finetuning trial's bookkeeping: its metrics.jsonl, best evaluation and checkpoint, early stopping."""

import json
import os
import shutil

from bert_jax import atomic_write
from bert_jax import metrics_writer


class Tracker:
  """One trial's log, best evaluation and patience; saved with `last/` so a continued run keeps them."""

  def __init__(self, workdir: str, primary_metric: str, patience: int, *, echo: bool = True, name: str = ""):
    """`echo`: its log lines on stdout too, each after `[name] ` where a name is given (a sweep's trial)."""
    self.workdir, self.primary, self.patience = workdir, primary_metric, patience
    self.writer = metrics_writer.MetricWriter(workdir, echo=echo)
    self._prefix = f"[{name}] " if name else ""
    self.best, self.best_step, self.best_metrics, self.last_metrics = None, -1, {}, {}
    self.since_best, self.stopped, self.stopped_step = 0, False, None
    self.diverged = None   # the step at which its loss or parameters were found not finite
    self.peek = None   # the primary metric at an epoch budget between evaluations (`peeked`)
    path = os.path.join(workdir, "tracker.json")
    if os.path.isdir(os.path.join(workdir, "last")) and os.path.isfile(path):   # a continued run
      with open(path) as f:
        self.__dict__.update(json.load(f))
    else:   # a new run in this workdir: a finished run's best/ would stand for it (a save at its step is skipped)
      shutil.rmtree(os.path.join(workdir, "best"), ignore_errors=True)

  def log(self, step: int, scalars: dict) -> None:
    self.writer.write(step, scalars, prefix=self._prefix)

  def evaluated(self, step: int, metrics: dict, on_best) -> None:
    """Records an evaluation; calls `on_best()` when it is the best so far."""
    self.log(step, {f"eval/{k}": v for k, v in metrics.items()})
    self.last_metrics = metrics
    if self.best is None or metrics[self.primary] > self.best:  # every task's primary metric: higher is better
      self.best, self.best_step, self.best_metrics, self.since_best = metrics[self.primary], step, metrics, 0
      on_best()
    else:
      self.since_best += 1
      self.stopped = bool(self.patience) and self.since_best >= self.patience
      self.stopped_step = step if self.stopped else None

  def diverge(self, step: int) -> None:
    """Stops the trial: its training loss or parameters are no longer finite at `step`. Its best evaluation
    so far stands; nothing after it is evaluated."""
    self.stopped, self.stopped_step, self.diverged = True, step, step
    self.writer.write(step, {"event": "diverged"}, prefix=self._prefix)
    if self.writer.enabled and self.writer.echo:   # process 0, as the writer's lines
      print(f"{self._prefix}step {step}: the training loss or the parameters are not finite: this trial stops",
            flush=True)

  def peeked(self, step: int, metrics: dict) -> None:
    """An evaluation at an epoch budget between the regular ones: logged, and its primary metric kept as
    `peek` (the trial's score there), with no say in the best checkpoint or early stopping."""
    self.log(step, {f"budget_eval/{k}": v for k, v in metrics.items()})
    self.peek = metrics[self.primary]

  def score(self) -> float | None:
    """The best of the evaluations so far, the budget's included (successive halving ranks by it)."""
    scores = [x for x in (self.best, self.peek) if x is not None]
    return max(scores) if scores else None

  def save(self) -> None:
    self.writer.close()
    keys = ("best", "best_step", "best_metrics", "last_metrics", "since_best", "stopped", "stopped_step",
            "diverged")
    with atomic_write.replacing(os.path.join(self.workdir, "tracker.json")) as tmp, open(tmp, "w") as f:
      json.dump({k: getattr(self, k) for k in keys}, f)   # whole or absent: a continued run reads it

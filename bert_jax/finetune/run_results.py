"""A finetuning trial's results: `results.json`, which marks the run finished, and how a command ends on a run
whose loss or parameters stopped being finite."""

import json
import os

from bert_jax import atomic_write
from bert_jax import failures

RESULTS_FILE = "results.json"


def write(tracker, config, task, step, steps_per_epoch, total_steps, finished, seconds) -> dict:
  """A trial's results (also its `RESULTS_FILE`), its tracker saved first."""
  tracker.save()
  step = step if tracker.stopped_step is None else tracker.stopped_step   # stopped early: its own last step
  results = {"task": task.name, "primary_metric": tracker.primary, "best": tracker.best, "score": tracker.score(),
             "best_step": tracker.best_step, "best_metrics": tracker.best_metrics,
             "last_metrics": tracker.last_metrics, "step": step, "epochs": step / steps_per_epoch,
             "total_steps": total_steps, "stopped_early": tracker.stopped, "finished": finished,
             "diverged_step": tracker.diverged, "seconds": round(seconds, 1), "learning_rate": config.learning_rate,
             "batch_size": config.batch_size, "num_epochs": config.num_epochs, "seed": config.seed}
  # Whole or absent: it marks the run finished (`bert-jax finetune` run again prints it instead of training).
  with atomic_write.replacing(os.path.join(tracker.workdir, RESULTS_FILE)) as tmp, open(tmp, "w") as f:
    json.dump(results, f, indent=1)
  return results


def raise_if_diverged(results: dict, workdir: str) -> None:
  """A run whose loss or parameters stopped being finite ends the command as the pretraining guard does (exit 3,
  one paragraph): its results.json and best evaluation are kept, and the same command prints them again."""
  if results.get("diverged_step") is None:
    return
  if results["best_step"] < 0:
    best = "no evaluation came before it"
  else:
    best = (f"its best evaluation was at step {results['best_step']} ({results['primary_metric']} "
            f"{results['best']:.4g})" + (", kept in best/" if os.path.isdir(os.path.join(workdir, "best")) else ""))
  raise failures.Diverged(
      f"{workdir}: the training loss or the parameters were not finite at step {results['diverged_step']} "
      f"(learning rate {results['learning_rate']:g}); the run stopped there and {best}. Lower the learning rate "
      "(--config.learning_rate, or bert_jax.fit's learning_rate=), or check the data and the checkpoint, then run "
      "it in another workdir")

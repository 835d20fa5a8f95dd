"""task.json, a finetuned workdir's record of its task: what `tasks.from_record` needs to rebuild the task
(its label set included) and its model's head; `bert-jax predict`, `export` and `api` read it."""

import json

from etils import epath
import jax
import ml_collections

from bert_jax import checkpoint_loader

TASK_FILE = "task.json"


def write(workdir: str, task, config: ml_collections.ConfigDict) -> None:
  """task.json: what `tasks.from_record` needs to rebuild the task (its label set included) and its
  model's head, beside the run record of `checkpoint_loader.write_run_record`."""
  if jax.process_index() != 0:
    return
  task_opts = config.task_opts.to_dict()
  if "classifier_pooling" in task.options:   # as resolved for this model, so the same head is rebuilt
    task_opts["classifier_pooling"] = task.options["classifier_pooling"]
  record = {"task": config.task, "task_opts": task_opts, "kind": task.kind,
            "label_names": list(task.label_names), "primary_metric": task.primary_metric,
            "max_seq_length": config.max_seq_length, "scalar_mix": config.scalar_mix}
  (epath.Path(workdir) / TASK_FILE).write_text(json.dumps(record, indent=1) + "\n")


def read(checkpoint) -> dict | None:
  """The task.json of the finetuned workdir holding `checkpoint` (the workdir, best/ ...), or None."""
  record = epath.Path(checkpoint_loader.find(checkpoint).directory) / TASK_FILE
  return json.loads(record.read_text()) if record.exists() else None

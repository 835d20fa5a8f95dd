"""A finetuning workdir holds one run: run again with its config, a finished run is its results; an unfinished one
starts over; a finished run of another config stops the command (`bert-jax finetune`, `bert_jax.fit`)."""

import os

from absl import logging

from bert_jax import config_record
from bert_jax import failures
from bert_jax import metrics_writer
from bert_jax import paths
from bert_jax.finetune import trainer

RUN_CONFIG = "finetune_config.json"   # the config the run recorded on its first start in the workdir
# Fields a run's results do not depend on: how it logs and lays its arrays over the devices (a sweep's too).
LOGGING_AND_LAYOUT = ("log_every_steps", "trials_over_devices", "mesh", "logical_axis_rules")
RESULT_FREE = (*LOGGING_AND_LAYOUT, "sweep")   # and what `bert-jax sweep` would vary


def finished(config, workdir: str) -> dict | None:
  """The results of the run `workdir` holds when it finished with this config (a command run again repeats
  nothing); None where this run is to train. A finished run of another config stops the command
  (`config_record.check_same_config`), and so does one finished before its config was recorded. A run that
  did not finish starts over, whatever its config: its record is replaced and its records removed
  (finetuning saves no state within a run, and two runs' curves in one metrics.jsonl would read as one)."""
  workdir = paths.absolute(workdir)
  config_record.check_workdir_kind(workdir, "finetuning")
  record = os.path.join(workdir, RUN_CONFIG)
  results = config_record.read_marker(os.path.join(workdir, trainer.RESULTS_FILE))
  if results is not None:
    if not os.path.isfile(record):
      raise failures.UserError(f"{workdir} holds a finished finetuning run whose config is not recorded: give "
                               "another --workdir, or remove that directory to run it again")
    config_record.check_same_config(record, config, paths.FINETUNE_FIELDS, ignore=RESULT_FREE, record=False)
    logging.warning("%s holds this finetuning run, finished: its results follow (remove the directory to "
                    "run it again)", workdir)
    return results
  stale = trainer.prediction_files(workdir)   # an earlier attempt's, which this run may not write again
  for path in stale:
    os.remove(path)
  if metrics_writer.remove_records(workdir) or stale:
    logging.warning("%s held a finetuning run that did not finish: this one starts over (finetuning saves no "
                    "state within a run)", workdir)
  if os.path.isfile(record):
    os.remove(record)
  os.makedirs(workdir, exist_ok=True)
  config_record.check_same_config(record, config, paths.FINETUNE_FIELDS, ignore=RESULT_FREE)   # records it
  return None

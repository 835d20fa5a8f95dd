"""`bert-jax finetune`: flags, then `trainer.finetune(config, workdir)`.

    bert-jax finetune --config=configs/finetune/sst2.py --workdir=/tmp/sst2 \
        --config.init_checkpoint=/path/to/hf_or_tf_or_bert_jax_checkpoint --config.data_dir=/path/to/SST-2

The results (best dev metric, its step, wall time) are printed as JSON and written to
`<workdir>/results.json`; the per-step log is `<workdir>/metrics.jsonl`. A data file that cannot be used
(a missing column or label, an empty file, a label the training file does not have, a byte that is not
UTF-8) stops the command before training with one paragraph naming it, and exit code 2. SIGTERM or Ctrl-C
stops it with one line (exit 143 or 130); the same command then starts the run over. A training loss or
parameters that stop being finite end the run there, its results and best evaluation kept, with one paragraph
and exit 3 (`run_results.raise_if_diverged`).
"""

import json
import sys

from bert_jax import config_path

config_path.put_config_root_on_path(sys.argv)

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import app
from absl import flags
from ml_collections import config_flags

from bert_jax import cli
from bert_jax import config_loading
from bert_jax import failures
from bert_jax.finetune import run_results
from bert_jax.finetune import run_workdir
from bert_jax.finetune import trainer

# Also `bert-jax sweep`'s and `bert-jax ablate`'s flags (they import this module).
CONFIG = config_flags.DEFINE_config_file("config", None, "A finetuning config (finetune, sweep), e.g. "
                                         "configs/finetune/sst2.py; an ablation (ablate), e.g. "
                                         "configs/ablations/devlin_table5.py:small.")
WORKDIR = flags.DEFINE_string("workdir", None, "finetune: its metrics, best checkpoint, predictions and results; "
                              "sweep and ablate: a subdirectory per run, and the results tables.")
flags.mark_flags_as_required(["workdir"])  # and --config, checked in main (`sweep --summarize` needs none)


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  config = config_loading.load_config(CONFIG, "bert-jax finetune", kind="finetune")
  if config is None:
    raise app.UsageError("--config is required")
  # The data or a task option (readers.DataError), a data_dir or file that is not there: no traceback.
  with failures.as_user_errors("bert-jax finetune", failures.UserError, FileNotFoundError):
    results = run_workdir.finished(config, WORKDIR.value)
    if results is None:
      with failures.stop_message("bert-jax finetune", "finetuning saves no state within a run: the same command "
                                 "starts it over"):
        results = trainer.finetune(config, WORKDIR.value)
  print(json.dumps(results, indent=1))
  try:
    run_results.raise_if_diverged(results, WORKDIR.value)
  except failures.Diverged as e:   # exit 3, as pretraining's guard: a run again would diverge the same way
    failures.say_and_exit(e, prefix="bert-jax finetune")


if __name__ == "__main__":
  cli.run_module(main, "bert-jax finetune")

"""`bert-jax ablate`: reruns a paper's ablation table and writes it beside the paper's numbers.

    bert-jax ablate --config=configs/ablations/devlin_table5.py:small --workdir=runs/ablate_t5 \
        --config.base.data.train_files=prepared/news \
        --config.tasks.sst2.data_dir=../shared/data/tasks/rotten_tomatoes

`:small` is sized for a 2-core CPU, `:paper` is the paper's recipe (TPU pods), `:tiny` runs in seconds
(tests). For each variant it pretrains, reads the held-out evaluation, finetunes every task over the
seeds, then writes `<workdir>/results.md`, `results.csv` and `results.png` (bert_jax/ablate/report.py).
Killed and run again, it redoes nothing that finished (bert_jax/ablate/runner.py); `--report_only`
rebuilds the tables from what is on disk without training (no data flags needed); `--variants=a,b` runs only those variants (two
processes or hosts with disjoint lists can share one workdir).
"""

import os
import sys

from bert_jax import config_path

config_path.put_config_root_on_path(sys.argv)

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import app
from absl import flags

from bert_jax import cli
from bert_jax import config_loading
from bert_jax import failures
from bert_jax import paths
from bert_jax.ablate import report
from bert_jax.ablate import runner
# The --config (any config file: here configs/ablations/<table>.py[:scale]) and --workdir flags of
# `bert-jax finetune`, which the runner's finetuning (`bert-jax sweep`'s code) imports anyway.
from bert_jax.finetune import main as finetune_main

flags.adopt_module_key_flags(finetune_main)   # --help lists them
_REPORT_ONLY = flags.DEFINE_bool("report_only", False, "Only rebuild the tables and plot from the finished runs.")
_VARIANTS = flags.DEFINE_list("variants", [], "Run only these variants (names as in results.csv); the tables "
                              "are still built from every finished variant in --workdir. Processes given "
                              "disjoint lists may share one --workdir.")


def run_and_report(ablation, workdir: str, train: bool = True, only=()) -> str:
  """The library call behind the command (tests make it too): runs what is missing, writes the report."""
  workdir = paths.absolute(workdir)
  if train:
    runner.run(ablation, workdir, only=only)
  elif not os.path.isdir(workdir):
    what = "is a file, not a workdir" if os.path.exists(workdir) else "does not exist"
    raise failures.UserError(f"--report_only: {workdir} {what}; give the --workdir the table ran in (or "
                             "run it there first, without --report_only)")
  return report.write_all(ablation, runner.collect(ablation, workdir), workdir)


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  config = config_loading.load_config(finetune_main.CONFIG, "bert-jax ablate", kind="ablation")
  if config is None:
    raise app.UsageError("--config is required, e.g. --config=configs/ablations/devlin_table5.py:small")
  try:
    # Pretraining saves and stops on its own at a SIGTERM (exit 143); this covers the rest: setup, evaluation
    # and finetuning.
    with failures.stop_message("bert-jax ablate", "the finished pretraining, evaluations and finetuning trials "
                               "are kept: the same command goes on from them"):
      report_text = run_and_report(config, finetune_main.WORKDIR.value, train=not _REPORT_ONLY.value,
                                   only=_VARIANTS.value)
    print(report_text)
  except failures.RunError as e:
    failures.say_and_exit(e, prefix="bert-jax ablate")


if __name__ == "__main__":
  cli.run_module(main, "bert-jax ablate")

"""`bert-jax pretrain`: flags, multi-host initialization, then `train.train_and_evaluate`.

    bert-jax pretrain --config=configs/tiny.py --workdir=/tmp/bert_tiny
    bert-jax pretrain --config=configs/bert_large.py:phase2 --workdir=DIR --config.init_from=PHASE1/checkpoints
    python -m bert_jax.main --config=configs/tiny.py --workdir=/tmp/bert_tiny --config.train_steps=100
"""

import os
import sys

from bert_jax import config_path
from bert_jax import host_env

config_path.put_config_root_on_path(sys.argv)
host_env.configure()   # before JAX is imported: quiet on CPU hosts

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import app
from absl import flags
from absl import logging
import jax
from ml_collections import config_flags

from bert_jax import train

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file, e.g. configs/tiny.py or configs/bert_large.py:phase2.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Checkpoints, metrics.jsonl and TensorBoard logs go here.")
flags.mark_flags_as_required(["config", "workdir"])


def _needs_distributed(dist) -> bool:
  """`auto`: a coordinator is configured or the environment is a multi-host TPU slice."""
  if dist.initialize == "yes":
    return True
  if dist.initialize == "no":
    return False
  if dist.initialize != "auto":
    raise ValueError(f"distributed.initialize must be auto, yes or no; got {dist.initialize!r}")
  hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
  return bool(dist.coordinator_address) or "," in hosts or "MEGASCALE_COORDINATOR_ADDRESS" in os.environ


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)   # libraries' INFO lines would bury the progress lines
  config = _CONFIG.value
  dist = config.distributed
  if _needs_distributed(dist):
    jax.distributed.initialize(
        coordinator_address=dist.coordinator_address or None,
        num_processes=dist.num_processes if dist.num_processes > 0 else None,
        process_id=dist.process_id if dist.process_id >= 0 else None)
  logging.info("process %d/%d, %d devices", jax.process_index(), jax.process_count(), jax.device_count())
  try:
    train.validate(config)   # again inside train_and_evaluate; here to show the message without a traceback
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  train.train_and_evaluate(config, _WORKDIR.value)


if __name__ == "__main__":
  app.run(main)

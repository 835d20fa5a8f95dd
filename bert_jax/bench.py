"""`bert-jax bench data|train`: benchmarks that print JSON lines (never part of the test suite)."""

import importlib

from absl import app

_BENCHES = {
    "data": "bert_jax.bench_data",    # input pipeline and `prepare` throughput
    "train": "bert_jax.bench_train",  # train step time, tokens/s, MFU
}


def main(argv):
  if len(argv) < 2 or argv[1] not in _BENCHES:
    raise app.UsageError(f"usage: bert-jax bench {{{'|'.join(_BENCHES)}}} [flags]")
  importlib.import_module(_BENCHES[argv[1]]).run(argv[1:])

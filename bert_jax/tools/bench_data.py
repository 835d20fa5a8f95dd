"""`bert-jax bench data`: input-pipeline sequences/s per CPU core, and `prepare` tokens/s.

    bert-jax bench data                                   # the shared news corpus, seq 128 and 512
    bert-jax bench data --input=corpus.jsonl --vocab_file=vocab.txt --seq_lengths=128
    bert-jax bench data --prepared_dir=data/news          # skip `prepare`, time the pipeline only

Prints one JSON line per measurement. The pipeline figure is what a training host gets: the real
iterator (tf.data, `num_parallel_calls` threads) from prepared shards, with sentence-pair sampling
and dynamic masking, timed after its first batch over at least `min_batches` batches and into the
next epoch (so planning an epoch is included); "per core" divides by the CPU time of the whole
process, all threads included.
"""

import ctypes
import gc
import json
import os
import pathlib
import tempfile
import time

from absl import flags
import numpy as np

from bert_jax import config_path
from bert_jax import failures
from bert_jax import paths
from bert_jax.data import input_pipeline
from bert_jax.data import prepare
from bert_jax.data import shards

# The clone's root (bert_jax/tools/ is two levels in); the shared data sits beside the clone.
_SHARED = pathlib.Path(__file__).resolve().parents[2].parent / "shared" / "data"

# --input and --vocab_file are `prepare`'s own flags (defined when it is imported); here they
# default to the shared news corpus and the MiniLM vocab. Declared key flags here, `--help` lists them.
FLAGS = flags.FLAGS
flags.declare_key_flag("input")
flags.declare_key_flag("vocab_file")
_NUM_SHARDS = flags.DEFINE_integer("prepare_shards", None, "Shards to prepare into (default: one per core, "
                                   "so that every core tokenizes).")
_PREPARED_DIR = flags.DEFINE_string("prepared_dir", None, "Already prepared shards: skip the `prepare` timing.")
_WORK_DIR = flags.DEFINE_string("work_dir", None, "Where to prepare the corpus (default: a temporary directory).")
_SEQ_LENGTHS = flags.DEFINE_list("seq_lengths", ["128", "512"], "Sequence lengths to time.")
_FORMAT = flags.DEFINE_enum("format", "nsp", ["nsp", "sop", "full_sentences", "doc_sentences", "doc_segments"],
                            "Instance format.")
_MASKING = flags.DEFINE_enum("masking", "token", ["token", "word", "span"], "Masking scheme.")
_PACKING = flags.DEFINE_bool("packing", False, "Pack short instances into rows.")
_BATCH = flags.DEFINE_integer("global_batch_size", 256, "Rows per batch.", lower_bound=1)
_MIN_BATCHES = flags.DEFINE_integer("min_batches", 200, "Time at least this many batches (and whole epochs).",
                                    lower_bound=1)
_NUM_PARALLEL_CALLS = flags.DEFINE_integer("num_parallel_calls", 1, "tf.data threads building batches.")
_MALLOC_ARENA_MAX = flags.DEFINE_integer(
    "malloc_arena_max", 0, "If > 0, cap glibc's malloc arenas (as MALLOC_ARENA_MAX does) before timing. "
    "By default a tf.data thread gets its own arena, which hands the pages of every freed batch back "
    "to the kernel and faults them in again: about half the pipeline's CPU time on this machine kind.")

# google-research/bert: max_predictions_per_seq 20 at 128, 80 at 512 (its README).
_MAX_PREDICTIONS = {128: 20, 512: 80}


def data_config(prepared_dir: str, seq_length: int):
  """`configs/common.py`'s data fields, set from the flags."""
  config_path.put_shipped_configs_first()
  from configs import common  # pylint: disable=g-import-not-at-top
  c = common.data_config()
  c.train_files, c.eval_fraction = prepared_dir, 0.0
  c.seq_length = seq_length
  c.max_predictions_per_seq = _MAX_PREDICTIONS.get(seq_length, round(seq_length * 0.15))
  c.format, c.packing = _FORMAT.value, _PACKING.value
  c.whole_word_masking, c.span_masking = _MASKING.value == "word", _MASKING.value == "span"
  c.num_parallel_calls = _NUM_PARALLEL_CALLS.value
  return c


def time_pipeline(prepared_dir: str, seq_length: int) -> dict:
  """Sequences per CPU-second of the iterator over at least `min_batches` batches and one epoch."""
  start = time.time()
  it = input_pipeline.create_pretrain_iterator(data_config(prepared_dir, seq_length),
                                               global_batch_size=_BATCH.value, process_index=0, process_count=1)
  load_seconds = time.time() - start
  start = time.time()
  next(it)  # builds and traces the tf.data pipeline and plans epoch 0: once per run
  first_batch_seconds = time.time() - start
  cpu, wall = time.process_time(), time.perf_counter()
  batches = 0
  while batches < _MIN_BATCHES.value or it.get_state()["epoch"] == 0:  # a new epoch's plan included
    next(it)
    batches += 1
  cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
  sequences = batches * _BATCH.value
  # The same batches built directly, without tf.data: the numpy work alone.
  numpy_cpu = time.process_time()
  n = it.maker.rows_per_batch
  for b in range(min(batches, it.maker.num_rows(0) // n)):
    it.maker.batch(0, b * n + np.arange(n))
  numpy_cpu = time.process_time() - numpy_cpu
  return {"bench": "pipeline", "seq_length": seq_length, "format": _FORMAT.value, "masking": _MASKING.value,
          "packing": _PACKING.value, "global_batch_size": _BATCH.value, "batches": batches,
          "epochs": it.get_state()["epoch"], "documents": it.maker.docs.num_documents,
          "num_parallel_calls": _NUM_PARALLEL_CALLS.value, "malloc_arena_max": _MALLOC_ARENA_MAX.value,
          "load_seconds": round(load_seconds, 3), "first_batch_seconds": round(first_batch_seconds, 3),
          "cpu_seconds": round(cpu, 3), "wall_seconds": round(wall, 3),
          "sequences_per_cpu_s": round(sequences / cpu), "sequences_per_s": round(sequences / wall),
          "numpy_only_sequences_per_cpu_s": round(min(batches, it.maker.num_rows(0) // n) * n / numpy_cpu)}


def _print(record: dict) -> None:
  print(json.dumps(record), flush=True)


def seq_lengths(values: list[str]) -> list[int]:
  """--seq_lengths as numbers; a UserError naming the flag for one that is not a length."""
  if not values or not all(v.strip().isdigit() and int(v) >= 8 for v in values):
    raise failures.UserError(f"--seq_lengths={','.join(values)}: give sequence lengths of at least 8, e.g. "
                             "--seq_lengths=128,512")
  return [int(v) for v in values]


def main(argv) -> None:
  """`bert-jax bench data`: prepares the corpus (timed), then times the pipeline per length."""
  if len(argv) > 1:
    raise ValueError(f"unexpected arguments: {argv[1:]}")
  lengths = seq_lengths(_SEQ_LENGTHS.value)
  # A corpus, vocabulary or folder that is not there or cannot be used: one paragraph, exit 2. The timing
  # after it raises as it raises.
  with failures.as_user_errors("bert-jax bench data", OSError, ValueError):
    prepared = _prepared()
  if _MALLOC_ARENA_MAX.value > 0:
    m_arena_max = -8  # glibc malloc.h
    ctypes.CDLL("libc.so.6").mallopt(m_arena_max, _MALLOC_ARENA_MAX.value)
  for seq_length in lengths:
    _print(time_pipeline(prepared, seq_length))
    gc.collect()  # the finished pipeline's threads and buffers go before the next one is timed


def _prepare_throughput(spec: str, vocab_file: str, output_dir: str, *, num_workers: int | None = None,
                       **kwargs) -> dict:
  """Runs `prepare.prepare_corpus` into an empty `output_dir` and returns its tokens/s (for `bench data`)."""
  if os.path.exists(os.path.join(output_dir, prepare.STATS_FILE)):
    raise ValueError(f"{output_dir} already holds a prepared corpus; give an empty directory")
  stats = prepare.prepare_corpus(spec, output_dir, vocab_file=vocab_file, num_workers=num_workers, **kwargs)
  workers = min(num_workers or os.cpu_count() or 1, len(stats["shards"]))
  return {"bench": "prepare", "input": spec, "tokens": stats["tokens"], "documents": stats["documents"],
          "workers": workers, "seconds": stats["seconds"],
          # End to end: process start-up, TensorFlow import, planning, tokenizing, writing.
          "tokens_per_s": round(stats["tokens"] / stats["seconds"]),
          # Tokenizing and writing only, with every worker busy: what a large corpus approaches.
          "tokens_per_s_steady": round(stats["tokens"] * workers / max(stats["worker_seconds"], 1e-9)),
          # Per CPU-second of the workers: the per-core rate, independent of other load on the host.
          "tokens_per_cpu_s": round(stats["tokens"] / max(stats["worker_cpu_seconds"], 1e-9))}


def _prepared() -> str:
  """--prepared_dir, checked; else the corpus prepared (timed) into --work_dir or a temporary folder."""
  if _PREPARED_DIR.value is not None:
    if not shards.shard_files(_PREPARED_DIR.value, "train"):
      raise failures.UserError(f"--prepared_dir={_PREPARED_DIR.value} holds no prepared shards (train-*.tfrecord): "
                               "give a `bert-jax prepare --output_dir` folder")
    return _PREPARED_DIR.value
  spec = FLAGS.input or str(_SHARED / "corpora" / "news_articles.jsonl")
  vocab = FLAGS.vocab_file or (str(_SHARED / "minilm" / "vocab.txt") if FLAGS.input is None else None)
  if not FLAGS.input and not pathlib.Path(spec).exists():
    raise failures.UserError(f"{spec} is not there: pass --input=<corpus> (and --vocab_file)")
  work_dir = (paths.output_dir(_WORK_DIR.value, "work_dir") if _WORK_DIR.value
              else tempfile.mkdtemp(prefix="bench_data_"))
  prepared = str(pathlib.Path(work_dir) / "prepared")
  num_shards = _NUM_SHARDS.value or os.cpu_count() or 1
  _print(_prepare_throughput(spec, vocab, prepared, num_shards=num_shards))
  return prepared

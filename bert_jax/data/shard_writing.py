"""The worker side of `bert-jax prepare` (bert_jax/data/prepare.py): one shard task.

A task names its corpus parts (from `corpus.plan`), the tokenizer's directory and its output shards.
`write_shard` reads the parts, tokenizes their documents in batches and writes the train shard (and the
eval shard of the documents it holds out), each under a temporary name renamed when complete. It runs in a
worker process whose pool calls `warm_up` first, or in the main process when there is one worker.
"""

import collections
import glob
import itertools
import os
import sys
import time
import zlib

import numpy as np

from bert_jax import host_env
from bert_jax.data import corpus
from bert_jax.data import tokenizer as tokenization

_SENTENCES_PER_BATCH = 4096        # one fast-tokenizer call; large enough to amortise its overhead
_REPORT_SECONDS = 60               # a long shard reports its progress this often

_WORKER_TOKENIZERS = {}


def _tokenizer(path: str, do_lower_case: bool):
  key = (path, do_lower_case)
  if key not in _WORKER_TOKENIZERS:
    _WORKER_TOKENIZERS[key] = tokenization.load_tokenizer(path, do_lower_case)
  return _WORKER_TOKENIZERS[key]


_WARM_UP_ERROR = []   # what warm_up raised in this pool worker


def warm_up(tokenizer_dir: str, do_lower_case: bool) -> None:
  """Pays for importing TensorFlow and building the tokenizer before timing starts."""
  host_env.import_tensorflow()
  _tokenizer(tokenizer_dir, do_lower_case).encode_batch(["warm up"])


def warm_up_worker(tokenizer_dir: str, do_lower_case: bool) -> None:
  """`warm_up` as a pool's initializer. A pool whose initializer raises starts a new worker in its place,
  forever: the error is kept instead, and the worker's first task raises it, which ends the pool."""
  try:
    warm_up(tokenizer_dir, do_lower_case)
  except Exception as e:  # pylint: disable=broad-exception-caught
    _WARM_UP_ERROR.append(e)


def _serialize(features: dict) -> bytes:
  """A `tf.train.Example` of int64 features."""
  tf = host_env.import_tensorflow()

  return tf.train.Example(features=tf.train.Features(feature={
      name: tf.train.Feature(int64_list=tf.train.Int64List(value=values.tolist()))
      for name, values in features.items()})).SerializeToString(deterministic=True)  # same bytes every run


def _is_eval(task_index: int, doc_index: int, eval_fraction: float) -> bool:
  """A fixed pseudo-random choice per (shard, document), so re-runs hold out the same documents."""
  return zlib.crc32(f"{task_index}:{doc_index}".encode()) < eval_fraction * 2**32


def _tokenized_documents(task, counters):
  """(document index, ids, sentence lengths) for the task's documents, tokenized in batches."""
  tok = _tokenizer(task["tokenizer_dir"], task["do_lower_case"])
  documents = (d for part in task["parts"] for d in corpus.read_part(
      part, text_key=task["text_key"], counters=counters))
  batch, sentences, index = [], 0, 0
  for document in itertools.chain(documents, [None]):
    if document is not None:
      batch.append(document)
      sentences += len(document)
      if sentences < _SENTENCES_PER_BATCH:
        continue
    for ids, lengths in _encode_documents(tok, batch, counters):
      yield index, ids, lengths
      index += 1
    batch, sentences = [], 0


def _encode_documents(tok, documents, counters):
  if not documents:
    return
  ids, lengths = tok.encode_batch([s if i == 0 else tok.space_prefix + s for d in documents
                                   for i, s in enumerate(d)])
  starts = np.cumsum(lengths) - lengths
  first = 0
  for document in documents:
    doc_lengths = lengths[first:first + len(document)]
    doc_ids = ids[starts[first]:starts[first] + doc_lengths.sum()]
    first += len(document)
    if (doc_lengths == 0).any():
      counters["empty_sentences"] += int((doc_lengths == 0).sum())  # e.g. only control characters
      doc_lengths = doc_lengths[doc_lengths > 0]
    if not len(doc_lengths):
      counters["empty_documents"] += 1
      continue
    yield doc_ids, doc_lengths


def write_shard(task) -> dict:
  """Writes the task's train (and eval) shard; returns its counts. Runs in a worker process."""
  if _WARM_UP_ERROR:
    raise _WARM_UP_ERROR[0]
  tf = host_env.import_tensorflow()

  start, cpu_start = time.time(), time.process_time()
  counters = collections.Counter()
  counts = {split: collections.Counter() for split in task["outputs"]}
  for stale in (p for path in task["outputs"].values() for p in glob.glob(path + ".tmp-*")):
    os.remove(stale)  # left by a killed run
  tmp = {split: path + f".tmp-{os.getpid()}" for split, path in task["outputs"].items()}
  writers = {split: tf.io.TFRecordWriter(path) for split, path in tmp.items()}
  last_report = start
  for index, ids, lengths in _tokenized_documents(task, counters):
    if time.time() - last_report > _REPORT_SECONDS:
      last_report = time.time()
      print(f"{task['name']}: {index} documents, {sum(c['tokens'] for c in counts.values())} tokens",
            file=sys.stderr, flush=True)
    held_out = "eval" in writers and _is_eval(task["index"], index, task["eval_fraction"])
    split = "eval" if held_out or "train" not in writers else "train"
    writers[split].write(_serialize({"token_ids": ids, "sentence_lengths": lengths}))
    counts[split].update(documents=1, sentences=len(lengths), tokens=len(ids))
  for split, writer in writers.items():
    writer.close()
    os.replace(tmp[split], task["outputs"][split])
    counts[split]["bytes"] = os.path.getsize(task["outputs"][split])   # the reader checks it (stats.json)
  return {"task": task["name"], "counters": dict(counters), "seconds": time.time() - start,
          "cpu_seconds": time.process_time() - cpu_start,
          "shards": {os.path.basename(task["outputs"][s]): dict(c) for s, c in counts.items()}}

"""`bert-jax bench data` end to end on a small corpus: it prepares it (timed), then times the pipeline."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = "the a king queen knight horse castle sword crown river forest dragon sees finds rides wears".split()


@pytest.mark.slow
def test_bench_data_prepares_and_times_a_small_corpus(tmp_path):
  rng = np.random.default_rng(0)
  documents = ["\n".join(" ".join(rng.choice(WORDS, 8)) + " ." for _ in range(6)) for _ in range(60)]
  (tmp_path / "corpus.txt").write_text("\n\n".join(documents) + "\n")
  (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", *WORDS]) + "\n")
  run = subprocess.run(
      [sys.executable, "-m", "bert_jax.cli", "bench", "data", "--input=corpus.txt", "--vocab_file=vocab.txt",
       "--work_dir=bench", "--seq_lengths=64", "--global_batch_size=8", "--min_batches=4", "--prepare_shards=1"],
      cwd=tmp_path, env={k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}, capture_output=True,
      text=True, timeout=600)
  assert run.returncode == 0, run.stderr[-3000:]
  records = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
  assert records[0]["tokens_per_s"] > 0   # prepare's
  assert records[1]["seq_length"] == 64 and records[1]["sequences_per_cpu_s"] > 0, records


def test_help_lists_the_corpus_flags_it_shares_with_prepare():
  run = subprocess.run([sys.executable, "-m", "bert_jax.cli", "bench", "data", "--help"], cwd=REPO,
                       env={k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}, capture_output=True,
                       text=True, timeout=300)   # absl's --help exits 1
  listed = {line.split(":")[0].strip() for line in run.stdout.splitlines() if line.strip().startswith("--")}
  assert {"--input", "--vocab_file", "--prepare_shards", "--seq_lengths"} <= listed, run.stdout

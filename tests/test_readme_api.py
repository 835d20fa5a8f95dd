"""The README's Python API examples, run as a user runs them.

The `python` blocks of the README's `## Python API` section run as one script in a fresh working
directory, as a subprocess on one CPU device. `workdir/tiny` (the quick start's run there) is stood in for
by a small random BertForPreTraining checkpoint whose vocabulary holds the examples' words.
"""

import os
import pathlib
import re
import subprocess
import sys

import flax.linen as nn
import jax
import numpy as np
import pytest

from bert_jax.interop import checkpoints_hf
from bert_jax.models import heads
from bert_jax.models import encoder as model

ROOT = pathlib.Path(__file__).resolve().parents[1]


def readme_python_blocks() -> list[str]:
  """The code of the ```python blocks of the README's `## Python API` section."""
  text = (ROOT / "README.md").read_text()
  section = text.split("## Python API", 1)[1].split("\n## ", 1)[0]
  return re.findall(r"```python\n(.*?)```", section, re.S)


def write_tiny_checkpoint(directory: pathlib.Path, text: str) -> None:
  """A random tiny BertForPreTraining (MLM + NSP) in Hugging Face format, with a vocabulary of `text`'s words."""
  words = sorted(set(re.findall(r"[a-z]+", text.lower())))
  vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ","] + words
  directory.mkdir(parents=True)
  (directory / "vocab.txt").write_text("\n".join(vocab) + "\n")
  cfg = model.BertConfig.from_preset("tiny", vocab_size=len(vocab), max_position_embeddings=64)
  ids = np.zeros((1, 8), np.int32)
  batch = {"input_ids": ids, "input_mask": ids, "segment_ids": ids, "masked_lm_positions": ids[:, :2]}
  params = nn.unbox(jax.jit(heads.BertForPreTraining(cfg).init)(jax.random.key(0), batch))["params"]
  checkpoints_hf.save_hf(directory, cfg, params)  # vocab.txt is already there


def test_readme_has_the_python_api_examples():
  blocks = readme_python_blocks()
  assert len(blocks) == 2, blocks
  assert "bert_jax.load(" in blocks[0] and "encode(" in blocks[0] and "fill_mask(" in blocks[0]
  assert "bert_jax.fit(" in blocks[1] and ".predict(" in blocks[1]


@pytest.mark.slow
def test_readme_python_api_examples_run(tmp_path):
  script = "\n".join(readme_python_blocks())
  write_tiny_checkpoint(tmp_path / "workdir" / "tiny", script)
  (tmp_path / "readme_api.py").write_text(script)
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}   # one CPU device, as a user has
  run = subprocess.run([sys.executable, "readme_api.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=600)
  assert run.returncode == 0, run.stderr[-3000:]
  assert "(2, 128)" in run.stdout and "'accuracy'" in run.stdout, run.stdout[-2000:]
  assert (tmp_path / "workdir" / "tweets" / "task.json").exists()

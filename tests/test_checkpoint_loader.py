"""checkpoint_loader: a pretraining run's record, the paths that name a run, finetuned workdirs, errors.

`trained_run` (one tiny pretraining run per test session) is shared with test_fill_mask and test_embed.
"""

import functools
import os

import jax
import numpy as np
import pytest

from bert_jax import checkpoint_loader
from bert_jax import checkpointing
from bert_jax.data import prepare
from bert_jax import train
from test_train import tiny_config

pytestmark = pytest.mark.slow  # the first test to ask for `trained_run` trains it (about 30 s on 2 cores)


def trained_run(tmp_path_factory) -> str:
  """The workdir of a tiny pretraining run (checkpoints at steps 5 and 10) and its run record."""
  return _train_once(tmp_path_factory.getbasetemp())


@functools.cache
def _train_once(basetemp) -> str:
  root = basetemp / "tiny_pretraining"
  root.mkdir()
  rng = np.random.default_rng(1)
  pairs = [("king", "crown"), ("knight", "sword"), ("queen", "castle"), ("dragon", "river")]
  docs = ["\n".join("the {} keeps the {} .".format(*pairs[rng.integers(len(pairs))]) for _ in range(6))
          for _ in range(40)]
  (root / "corpus.txt").write_text("\n\n".join(docs) + "\n")
  data = str(root / "prepared")
  prepare.prepare_corpus(str(root / "corpus.txt"), data, train_vocab_size=128, num_shards=1, num_workers=1)
  config = tiny_config(data, train_steps=10, checkpoint_every=5, eval_steps=0, log_every=10)
  workdir = str(root / "run")
  train.train_and_evaluate(config, workdir)
  # The loop is to write this at start; written here until it does (the same call, so harmless twice).
  checkpoint_loader.write_run_record(workdir, train.bert_config(config), data, config.data.do_lower_case)
  return workdir


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  return trained_run(tmp_path_factory)


def assert_same(a, b):
  jax.tree.map(np.testing.assert_array_equal, a, b)


def test_run_record_then_load_from_the_workdir_its_checkpoints_or_a_step(run, monkeypatch):
  assert {"bert_config.json", "vocab.txt", "tokenizer_config.json"} <= set(os.listdir(run))
  cfg, params, tok = checkpoint_loader.load(run)
  assert (cfg.vocab_size, cfg.hidden_size, cfg.num_layers, cfg.scan_layers) == (128, 32, 1, False)
  assert set(params) == {"bert", "mlm", "nsp"}
  assert_same(params, checkpointing.restore_params(os.path.join(run, "checkpoints")))
  assert tok.do_lower_case and tok.convert_tokens_to_ids(["king"]) != [tok.unk_id]
  monkeypatch.chdir(os.path.dirname(run))   # relative paths, as typed on a command line
  name = os.path.basename(run)
  for path in (f"{name}/checkpoints", f"{name}/checkpoints/10"):
    found = checkpoint_loader.find(path)
    assert (found.kind, found.directory) == ("bert_jax", run)
    assert_same(checkpoint_loader.load_model(path)[1], params)
  step5 = checkpoint_loader.load_model(f"{name}/checkpoints/5")[1]
  assert not np.array_equal(step5["mlm"]["output_bias"], params["mlm"]["output_bias"])


def test_scanned_layout_on_request(run):
  cfg, params = checkpoint_loader.load_model(run, scan_layers=True)
  assert cfg.scan_layers and set(params["bert"]["encoder"]) == {"layers"}
  assert params["bert"]["encoder"]["layers"]["intermediate"]["kernel"].shape == (1, 32, 64)


def test_finetuned_workdir_its_best_and_a_step(run, tmp_path):
  cfg, params = checkpoint_loader.load_model(run)
  workdir = tmp_path / "finetuned"
  saved = {"bert": params["bert"], "classifier": {"kernel": np.ones((32, 2), np.float32),
                                                  "bias": np.zeros(2, np.float32)}}
  best = checkpointing.Checkpointer(str(workdir / "best"), keep=1, async_save=False)
  best.save(3, {"params": saved})
  best.close()
  checkpoint_loader.write_run_record(str(workdir), cfg, os.path.join(run, "vocab.txt"), do_lower_case=False)
  for path in (workdir, workdir / "best", workdir / "best" / "3"):
    assert checkpoint_loader.find(path).directory == str(workdir)
    loaded_cfg, loaded, tok = checkpoint_loader.load(path)
    assert loaded_cfg == cfg and not tok.do_lower_case
    assert_same(loaded, saved)
  assert not checkpoint_loader.lower_case(workdir)


def test_errors_name_the_path_and_what_was_looked_for(run, tmp_path):
  with pytest.raises(FileNotFoundError, match=f"{tmp_path}/missing does not exist"):
    checkpoint_loader.find(tmp_path / "missing")
  (tmp_path / "empty").mkdir()
  with pytest.raises(ValueError, match=f"{tmp_path}/empty is not a checkpoint: looked for a Hugging Face"):
    checkpoint_loader.load(tmp_path / "empty")
  with pytest.raises(ValueError, match="checkpoint kind 'orbax'"):
    checkpoint_loader.find(run, kind="orbax")
  # A run from before its workdir had a record: the config must be given.
  (tmp_path / "old_run").mkdir()
  os.symlink(os.path.join(run, "checkpoints"), tmp_path / "old_run" / "checkpoints")
  with pytest.raises(FileNotFoundError, match="without its model config .*bert_config.json"):
    checkpoint_loader.load_model(tmp_path / "old_run")
  cfg, _ = checkpoint_loader.load_model(tmp_path / "old_run", bert_config_json=os.path.join(run, "bert_config.json"))
  assert cfg == checkpoint_loader.load_model(run)[0]

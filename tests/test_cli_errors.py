"""Every command ends a mistake its user can fix (a misspelt config field, a path that is not there) with one
paragraph on stderr and exit code 2: no traceback, whichever command it is (cli.py, config_loading.py, failures.py)."""

import os
import subprocess
import sys

import pytest

from bert_jax import config_loading
from bert_jax import failures

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cases(tmp):
  return {
      ("finetune", "--config=configs/finetune/sst2.py", f"--workdir={tmp}/f", "--config.num_epoch=1"):
          "bert-jax finetune: unknown config field 'num_epoch'. Did you mean \"num_epochs\"",
      ("sweep", "--config=configs/finetune/sst2.py", f"--workdir={tmp}/s", "--config.sweep.gridz=1"):
          "bert-jax sweep: unknown config field",
      ("sweep", "--config=configs/finetune/sst2.py", f"--workdir={tmp}/s2", f"--config.data_dir={tmp}/nowhere"):
          "bert-jax sweep: set config.vocab_file (or init_checkpoint",
      ("sweep", "--config=configs/finetune/sst2.py", f"--workdir={tmp}/s3", f"--config.data_dir={tmp}/nowhere",
       f"--config.vocab_file={tmp}/vocab.txt"): f"bert-jax sweep: {tmp}/nowhere does not exist",
      ("prepare", f"--input={tmp}/nowhere/*.txt", f"--output_dir={tmp}/p"):
          f"bert-jax prepare: no input files match '{tmp}/nowhere/*.txt'",
      ("prepare", f"--input={tmp}/nowhere/*.txt", f"--output_dir={tmp}/p2", "--num_shards=2"):
          f"bert-jax prepare: no input files match '{tmp}/nowhere/*.txt'",
      ("aot", "--config=configs/tiny.py", "--topology=v9:2x2"): "bert-jax aot: topology 'v9:2x2': expected",
      ("aot", "--config=configs/tiny_typo.py", "--topology=v4:2x2x1"): "bert-jax aot: cannot load --config",
      ("bench", "train", "--config=configs/tiny_typo.py"): "bert-jax bench train: cannot load --config",
      ("bench", "train", "--config=configs/tiny.py", "--steps=0"):   # checked before the compile and warm-up
          "bert-jax bench train: flag --steps=0: 0 is not a positive integer",
      ("bench", "data", f"--input={tmp}/nowhere.jsonl", "--seq_lengths=64"):
          f"bert-jax bench data: no input files match '{tmp}/nowhere.jsonl'",
      ("bench", "data", f"--prepared_dir={tmp}/nowhere"):
          f"bert-jax bench data: --prepared_dir={tmp}/nowhere holds no prepared shards",
      ("bench", "data", f"--input={tmp}/vocab.txt", f"--work_dir={tmp}/vocab.txt"):
          f"bert-jax bench data: --work_dir={tmp}/vocab.txt: it is a file: give a folder",
      ("bench", "data", "--seq_lengths=abc"): "bert-jax bench data: --seq_lengths=abc: give sequence lengths",
      # An output folder that is a file, and numbers out of range: before anything is read or made.
      ("prepare", f"--input={tmp}/vocab.txt", f"--output_dir={tmp}/vocab.txt/p"):
          f"bert-jax prepare: --output_dir={tmp}/vocab.txt/p: {tmp}/vocab.txt is a file: give a folder",
      ("prepare", f"--input={tmp}/vocab.txt", f"--output_dir={tmp}/p3", "--eval_fraction=1.5"):
          "bert-jax prepare: flag --eval_fraction=1.5: 1.5 is not a number in the range [0.0, 0.99]",
      ("prepare", f"--input={tmp}/vocab.txt", f"--output_dir={tmp}/p4", "--num_shards=0"):
          "bert-jax prepare: flag --num_shards=0: 0 is not a positive integer",
      ("export", f"--checkpoint={tmp}/nowhere", f"--output={tmp}/vocab.txt"):
          f"bert-jax export: --output={tmp}/vocab.txt: it is a file: give a folder",
      ("pretrain", f"--config={tmp}/notes.py", f"--workdir={tmp}/n"):   # it imports, and holds no config
          f"bert-jax pretrain: cannot load --config: {tmp}/notes.py defines no get_config(): give a config file",
      ("pretrain", "--config=configs/tiny.py", f"--workdir={tmp}/vocab.txt"):
          f"bert-jax pretrain: --workdir={tmp}/vocab.txt: it is a file: give a folder",
      ("finetune", "--config=configs/finetune/sst2.py", f"--workdir={tmp}/vocab.txt"):
          f"bert-jax finetune: --workdir={tmp}/vocab.txt: it is a file: give a folder",
      ("pretrain", "--config=configs/tiny_typo.py", f"--workdir={tmp}/t", "--config.train_steps=3"):
          # an override applied to a file that is not there
          f"bert-jax pretrain: cannot load --config: configs/tiny_typo.py does not exist (a relative path is taken "
          f"from {REPO})\n",
      ("finetune", "--config=configs/finetune/generic.py:pairs", f"--workdir={tmp}/g"):   # a variant the file lacks
          "bert-jax finetune: flag --config=configs/finetune/generic.py:pairs: Error whilst parsing config file: "
          "unknown variant 'pairs'; use 'single', 'pair' or 'tagging'\n",
      ("pretrain", "--config=configs/ablations/devlin_table5.py:small", f"--workdir={tmp}/ab"):
          "bert-jax pretrain: --config is an ablation table's config (configs/ablations/), not a pretraining config",
      ("finetune", "--config=configs/tiny.py", f"--workdir={tmp}/ft"):
          "bert-jax finetune: --config is a pretraining config",
      # With an override of a field only the right kind has: the kind is named, not the field.
      ("finetune", "--config=configs/tiny.py", f"--workdir={tmp}/ft2", "--config.init_checkpoint=x"):
          "bert-jax finetune: --config is a pretraining config",
      ("pretrain", "--config=configs/finetune/sst2.py", f"--workdir={tmp}/pt", "--config.train_steps=3"):
          "bert-jax pretrain: --config is a finetuning config",
      ("embed", f"--checkpoint={tmp}/nowhere", f"--input={tmp}/x.jsonl", f"--output={tmp}/e.npz"):
          f"bert-jax embed: checkpoint {tmp}/nowhere does not exist",
      ("embed", f"--checkpoint={tmp}/nowhere", f"--input={tmp}/x.jsonl", f"--output={tmp}/vocab.txt/e.npz"):
          f"bert-jax embed: cannot write {tmp}/vocab.txt/e.npz: its folder cannot be made (File exists",
      ("predict", f"--checkpoint={tmp}/nowhere", f"--input={tmp}/x.tsv", f"--output={tmp}/vocab.txt/p.tsv"):
          f"bert-jax predict: cannot write {tmp}/vocab.txt/p.tsv: its folder cannot be made (File exists",
      ("fill-mask", f"--checkpoint={tmp}/nowhere", "a [MASK] ."):
          f"bert-jax fill-mask: checkpoint {tmp}/nowhere does not exist",
      ("analyze", "attention", f"--checkpoint={tmp}/nowhere", f"--input={tmp}/x.txt", f"--output_dir={tmp}/a"):
          f"bert-jax analyze attention: checkpoint {tmp}/nowhere does not exist",
      ("analyze", "heads", f"--checkpoint={tmp}/nowhere", f"--input={tmp}/x.txt", f"--output_dir={tmp}/h"):
          f"bert-jax analyze heads: checkpoint {tmp}/nowhere does not exist",
  }


@pytest.mark.slow
def test_each_command_says_a_user_s_mistake_in_one_paragraph(tmp_path):
  (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b"]) + "\n")
  (tmp_path / "notes.py").write_text("x = 1\n")
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  procs = {argv: subprocess.Popen([sys.executable, "-m", "bert_jax.cli", *argv], cwd=REPO, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for argv in _cases(tmp_path)}
  for argv, message in _cases(tmp_path).items():
    _, err = procs[argv].communicate(timeout=300)
    assert procs[argv].returncode == failures.USER_ERROR, (argv, err[-3000:])
    assert "Traceback" not in err and message in err, (argv, err[-3000:])
  assert not (tmp_path / "p").exists() and not (tmp_path / "p2").exists()   # nothing written for no corpus


def test_each_command_takes_its_kind_of_config(capsys):
  from configs import tiny   # pylint: disable=g-import-not-at-top
  from configs.ablations import devlin_table5   # pylint: disable=g-import-not-at-top
  from configs.finetune import sst2   # pylint: disable=g-import-not-at-top
  configs = {"pretrain": tiny.get_config(), "finetune": sst2.get_config(), "ablation": devlin_table5.get_config("small")}
  assert {kind: config_loading.config_kind(c) for kind, c in configs.items()} == {k: k for k in configs}
  flag = type("Flag", (), {"value": configs["ablation"]})()
  assert config_loading.load_config(flag, "bert-jax ablate", kind="ablation") is configs["ablation"]
  with pytest.raises(SystemExit) as stopped:
    config_loading.load_config(flag, "bert-jax pretrain", kind="pretrain")
  assert stopped.value.code == failures.USER_ERROR
  assert "run it with `bert-jax ablate`" in capsys.readouterr().err


def test_as_user_errors_turns_only_the_kinds_named(capsys):
  with pytest.raises(SystemExit) as stopped:
    with failures.as_user_errors("bert-jax x", FileNotFoundError):
      raise FileNotFoundError("no such file: a.txt")
  assert stopped.value.code == failures.USER_ERROR
  assert capsys.readouterr().err == "bert-jax x: no such file: a.txt\n"
  with pytest.raises(KeyError):   # a bug stays a traceback
    with failures.as_user_errors("bert-jax x", FileNotFoundError):
      raise KeyError("x")

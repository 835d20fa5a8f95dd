"""User paths become absolute where they enter; commands start quietly on CPU hosts."""

import os
import subprocess
import sys

import ml_collections
import pytest

from bert_jax import host_env
from bert_jax import paths


def test_absolute_paths_and_the_ones_left_alone(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert paths.absolute("workdir/tiny") == str(tmp_path / "workdir" / "tiny")
  assert paths.absolute("runs/t,1") == str(tmp_path / "runs" / "t,1")   # one path, commas and all
  assert paths.absolute("~/x") == os.path.expanduser("~/x")
  for unchanged in ("", "gs://bucket/run", "embedded:shakespeare", "tfds:wikipedia:train", "tfds", "/abs/path"):
    assert paths.absolute(unchanged) == unchanged


def test_an_output_file_gets_its_folder_before_the_work(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert paths.output_file("out/deeper/preds.jsonl") == str(tmp_path / "out" / "deeper" / "preds.jsonl")
  assert (tmp_path / "out" / "deeper").is_dir() and not (tmp_path / "out" / "deeper" / "preds.jsonl").exists()
  assert paths.output_file("here.npz") == str(tmp_path / "here.npz")
  assert paths.output_file("new/a,b.jsonl") == str(tmp_path / "new" / "a,b.jsonl")   # a name, not a list
  (tmp_path / "a_file").write_text("")
  with pytest.raises(OSError, match="cannot write .*a_file/x.tsv: its folder cannot be made"):
    paths.output_file("a_file/x.tsv")
  (tmp_path / "a_folder").mkdir()   # refused before the work, named as typed
  with pytest.raises(IsADirectoryError, match=r"^a_folder is a folder: give the file to write$"):
    paths.output_file("a_folder")
  with pytest.raises(IsADirectoryError, match=r"^--hlo=a_folder/ is a folder: give the file to write, e.g. "
                     r"a_folder/step.hlo$"):
    paths.output_file("a_folder/", "hlo", example="step.hlo")


def test_an_output_folder_that_is_a_file_is_refused_naming_the_flag(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert paths.output_dir("exported/model", "output") == str(tmp_path / "exported" / "model")   # made later
  assert paths.output_dir("gs://bucket/x", "output") == "gs://bucket/x"
  (tmp_path / "notes.csv").write_text("")
  with pytest.raises(NotADirectoryError, match=r"^--output=notes.csv: it is a file: give a folder"):
    paths.output_dir("notes.csv", "output")
  with pytest.raises(NotADirectoryError, match=r"^--output_dir=notes.csv/sub: notes.csv is a file: give a folder"):
    paths.output_dir("notes.csv/sub", "output_dir")


def test_absolute_config_on_a_locked_config(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  c = ml_collections.ConfigDict({"init_from": "runs/p,1", "data": {"train_files": "prepared", "vocab_file": ""}})
  c.lock()
  paths.absolute_config(c, paths.PRETRAIN_FIELDS)
  assert c.init_from == str(tmp_path / "runs" / "p,1")
  assert c.data.train_files == str(tmp_path / "prepared")
  assert c.data.vocab_file == "" and c.is_locked


def test_configure_pins_jax_to_the_cpu_only_without_accelerators(monkeypatch):
  for has, expected in ((False, "cpu"), (True, None)):
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    monkeypatch.setattr(host_env, "has_accelerator", lambda has=has: has)
    host_env.configure()
    assert os.environ.get("JAX_PLATFORMS") == expected
  monkeypatch.setenv("JAX_PLATFORMS", "tpu")   # a user's choice is kept
  monkeypatch.setattr(host_env, "has_accelerator", lambda: False)
  host_env.configure()
  assert os.environ["JAX_PLATFORMS"] == "tpu"


@pytest.mark.slow
def test_tensorflow_imports_silently_and_sees_no_gpu():
  code = ("from bert_jax import host_env; host_env.configure(); tf = host_env.import_tensorflow(); "
          "print(tf.config.get_visible_devices('GPU'))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
  assert out.stdout.strip() == "[]"
  assert out.stderr == "", out.stderr

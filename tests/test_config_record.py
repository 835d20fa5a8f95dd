"""A stage's recorded config stops a later start with another config, and lets a run recorded before a
field was added resume while that field is at its empty default."""

import json

import ml_collections
import pytest

from bert_jax import config_record
from bert_jax import failures


def _config(learning_rate=2e-5, **task_opts):
  return ml_collections.ConfigDict({"learning_rate": learning_rate, "task_opts": {"text_a": "sentence", **task_opts}})


def test_a_field_added_since_the_record_is_the_same_while_empty(tmp_path):
  path = str(tmp_path / "config.json")
  config_record.check_same_config(path, _config(), fields=())   # recorded without `tfds_data_dir`
  config_record.check_same_config(path, _config(tfds_data_dir=""), fields=())
  with pytest.raises(failures.UserError, match=r"task_opts.tfds_data_dir differ"):
    config_record.check_same_config(path, _config(tfds_data_dir="data"), fields=())
  with pytest.raises(failures.UserError, match=r"learning_rate differ"):
    config_record.check_same_config(path, _config(tfds_data_dir="", learning_rate=1e-4), fields=())
  assert "tfds_data_dir" not in json.load(open(path))["task_opts"]   # the record stays as first written


def test_a_run_recorded_with_do_lower_case_true_goes_on_under_the_checkpoint_s(tmp_path):
  """finetuning's do_lower_case defaults to None (the checkpoint's tokenizer_config.json) since runs recorded it
  as True: those finish or resume; a recorded False does not match None."""
  import ml_collections  # pylint: disable=import-outside-toplevel
  old = ml_collections.ConfigDict({"do_lower_case": True, "learning_rate": 2e-5})
  new = ml_collections.ConfigDict({"do_lower_case": ml_collections.config_dict.placeholder(bool),
                                   "learning_rate": 2e-5})
  config_record.check_same_config(str(tmp_path / "old.json"), old, fields=())
  config_record.check_same_config(str(tmp_path / "old.json"), new, fields=())
  old.do_lower_case = False
  config_record.check_same_config(str(tmp_path / "cased.json"), old, fields=())
  with pytest.raises(failures.UserError, match=r"do_lower_case differ"):
    config_record.check_same_config(str(tmp_path / "cased.json"), new, fields=())


def test_how_a_run_compiles_may_change_between_its_starts(tmp_path):
  """`model.scan_unroll` (COMPILE_ONLY): a run recorded before the field existed, or with another value,
  resumes with any; it is left out of the record."""
  path = str(tmp_path / "config.json")
  config = lambda **model: ml_collections.ConfigDict({"learning_rate": 2e-5, "model": {"num_layers": 2, **model}})
  config_record.check_same_config(path, config(), fields=())   # recorded before the field
  config_record.check_same_config(path, config(scan_unroll=1), fields=())
  config_record.check_same_config(path, config(scan_unroll=24), fields=())
  with pytest.raises(failures.UserError, match=r"model.num_layers differ"):
    config_record.check_same_config(path, config(num_layers=4, scan_unroll=24), fields=())
  other = str(tmp_path / "other.json")
  config_record.check_same_config(other, config(scan_unroll=24), fields=())
  assert "scan_unroll" not in json.load(open(other))["model"]


def test_the_fields_that_differ_past_five_are_counted(tmp_path):
  path = str(tmp_path / "config.json")
  config_record.check_same_config(path, ml_collections.ConfigDict({f"f{i}": 0 for i in range(8)}), fields=())
  with pytest.raises(failures.UserError, match=r"\(f0, f1, f2, f3, f4 and 3 more differ\)"):
    config_record.check_same_config(path, ml_collections.ConfigDict({f"f{i}": 1 for i in range(8)}), fields=())


def test_a_workdir_of_one_kind_of_run_is_refused_by_the_others(tmp_path):
  from bert_jax.finetune import run_workdir, sweep, task_record  # pylint: disable=g-import-not-at-top
  # The names each kind is known by are its owners' own.
  assert config_record._RUN_KINDS == {  # pylint: disable=protected-access
      "pretraining": ("checkpoints",), "finetuning": (task_record.TASK_FILE, run_workdir.RUN_CONFIG),
      "sweep": (sweep.CONFIG,)}
  for kind, mark in (("pretraining", "checkpoints"), ("finetuning", "task.json"),
                     ("finetuning", "finetune_config.json"), ("sweep", "sweep_config.json")):
    workdir = tmp_path / mark
    workdir.mkdir()
    (workdir / mark).mkdir() if mark == "checkpoints" else (workdir / mark).write_text("{}")
    (workdir / "metrics.jsonl").write_text("")   # every kind writes one: no kind's mark
    config_record.check_workdir_kind(str(workdir), kind)   # its own kind: fine
    for other in {"pretraining", "finetuning", "sweep"} - {kind}:
      with pytest.raises(failures.UserError, match=f"holds a {kind} run \\({mark}\\), not a {other} run: give "
                         "another --workdir"):
        config_record.check_workdir_kind(str(workdir), other)
  config_record.check_workdir_kind(str(tmp_path / "new"), "pretraining")   # not there yet: fine
  (tmp_path / "notes.csv").write_text("")   # a file: each kind refuses it, or a folder in it, before making any
  for kind in ("pretraining", "finetuning", "sweep"):
    with pytest.raises(failures.UserError, match=r"--workdir=.*notes.csv: it is a file: give a folder"):
      config_record.check_workdir_kind(str(tmp_path / "notes.csv"), kind)
    with pytest.raises(failures.UserError, match=r"--workdir=.*notes.csv/run: .*notes.csv is a file: give a folder"):
      config_record.check_workdir_kind(str(tmp_path / "notes.csv" / "run"), kind)


def test_a_checkpoint_s_folder_is_no_workdir(tmp_path):
  """A run would write its vocabulary, task.json and results over a Hugging Face or TF checkpoint's files."""
  (tmp_path / "hf").mkdir()
  (tmp_path / "hf" / "config.json").write_text("{}")
  config_record.check_workdir_kind(str(tmp_path / "hf"), "finetuning")   # a config.json alone: no checkpoint
  (tmp_path / "hf" / "model.safetensors").write_bytes(b"")
  (tmp_path / "tf").mkdir()
  (tmp_path / "tf" / "bert_model.ckpt.index").write_bytes(b"")
  for kind in ("pretraining", "finetuning", "sweep"):
    for folder, held in (("hf", "config.json, model.safetensors"), ("tf", "bert_model.ckpt.index")):
      with pytest.raises(failures.UserError, match=f"holds a checkpoint \\({held}\\): a run writes its own files"):
        config_record.check_workdir_kind(str(tmp_path / folder), kind)

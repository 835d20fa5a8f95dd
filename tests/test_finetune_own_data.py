"""A user's own files through `configs/finetune/generic.py`: string labels read from the training file,
the label set saved with the model, and every unusable file stopped before training with its name."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bert_jax import failures
from bert_jax.finetune import init
from bert_jax.finetune import readers
from bert_jax.finetune import run_workdir
from bert_jax.finetune import trainer
from configs.finetune import generic
from test_finetune_train import WORDS, tiny_config, write_vocab

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SENTIMENTS = {"negative": WORDS[3:6], "neutral": ("the", "plot", "and"), "positive": WORDS[:3]}


def make_tweets(directory, n_train=48, n_dev=16, seed=0) -> str:
  """train.csv/dev.csv with `text` and `sentiment` (negative/neutral/positive) columns, and a vocab.txt."""
  write_vocab(directory)
  rng = np.random.default_rng(seed)
  for split, n in (("train", n_train), ("dev", n_dev)):
    with open(os.path.join(directory, f"{split}.csv"), "w") as f:
      f.write("id,text,sentiment\n")
      for i in range(n):
        label = sorted(SENTIMENTS)[i % 3]
        f.write(f"{i},{rng.choice(SENTIMENTS[label])} movie {' '.join(rng.choice(WORDS[6:], 3))},{label}\n")
  return str(directory)


def tweet_config(data_dir, **task_opts):
  c = tiny_config(data_dir, generic.get_config("single"))
  c.task_opts.text_a, c.task_opts.label = "text", "sentiment"
  c.task_opts.update(task_opts)
  c.num_epochs, c.max_train_examples = 1, 0
  return c


@pytest.fixture(scope="module")
def tweets(tmp_path_factory):
  return make_tweets(tmp_path_factory.mktemp("tweets"))


def _user_env():
  return {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one CPU device, as a user has


@pytest.mark.slow
def test_tweets_as_typed_on_the_command_line(tweets, tmp_path):
  """The issue's command: string labels, num_labels=3 (checked against the file's three labels)."""
  argv = [sys.executable, "-m", "bert_jax.cli", "finetune", "--config=configs/finetune/generic.py:single",
          f"--workdir={tmp_path}/run", f"--config.data_dir={tweets}", "--config.task_opts.text_a=text",
          "--config.task_opts.label=sentiment", "--config.task_opts.num_labels=3",
          f"--config.vocab_file={tweets}/vocab.txt", "--config.model.preset=tiny", "--config.model.vocab_size=32",
          "--config.model.max_position_embeddings=32", "--config.max_seq_length=16", "--config.batch_size=16",
          "--config.num_epochs=1"]
  run = subprocess.run(argv, cwd=ROOT, env=_user_env(), capture_output=True, text=True, timeout=600)
  assert run.returncode == 0, run.stderr[-3000:]
  record = json.loads((tmp_path / "run" / "task.json").read_text())
  assert record["label_names"] == ["negative", "neutral", "positive"] and record["kind"] == "classification"
  assert json.loads((tmp_path / "run" / "results.json").read_text())["finished"]
  # Run again, it repeats nothing; with another config in the same workdir, it stops.
  again = subprocess.run(argv, cwd=ROOT, env=_user_env(), capture_output=True, text=True, timeout=600)
  assert again.returncode == 0 and "finished: its results follow" in again.stderr, again.stderr[-3000:]
  assert json.loads(again.stdout) == json.loads((tmp_path / "run" / "results.json").read_text())
  other = subprocess.run(argv[:-1] + ["--config.num_epochs=2"], cwd=ROOT, env=_user_env(), capture_output=True,
                         text=True, timeout=600)
  assert other.returncode == failures.USER_ERROR and "holds a run of another config (num_epochs" in other.stderr


def test_a_finetune_workdir_repeats_a_finished_run_restarts_an_unfinished_one_and_keeps_its_config(tmp_path):
  config, workdir = tweet_config(str(tmp_path / "data")), tmp_path / "run"
  finished = lambda c: run_workdir.finished(c, str(workdir))
  assert finished(config) is None and (workdir / run_workdir.RUN_CONFIG).is_file()
  (workdir / "metrics.jsonl").write_text('{"step": 10}\n')   # killed before its end
  (workdir / "tensorboard").mkdir()
  (workdir / "predictions_dev.tsv").write_text("index\tprediction\n")   # of its best evaluation so far
  (workdir / "predictions_new.jsonl").write_text("{}\n")   # `bert-jax predict`'s, the user's: kept
  corrected = tweet_config(str(tmp_path / "data"))
  corrected.batch_size //= 2   # as a message asks after a failed start: it starts over with this config
  assert finished(corrected) is None
  assert sorted(os.listdir(workdir)) == [run_workdir.RUN_CONFIG, "predictions_new.jsonl"]   # its records gone
  (workdir / trainer.RESULTS_FILE).write_text('{"best_metric": 0.5}')
  assert finished(corrected) == {"best_metric": 0.5}   # finished: nothing to train
  corrected.log_every_steps += 1   # logged otherwise: the same results
  assert finished(corrected) == {"best_metric": 0.5}
  with pytest.raises(failures.UserError, match="holds a run of another config \\(batch_size differ\\)"):
    finished(config)
  os.remove(workdir / run_workdir.RUN_CONFIG)   # a run finished before its config was recorded
  for _ in range(2):   # refused, and refused again: the refusal records nothing
    with pytest.raises(failures.UserError, match="finished finetuning run whose config is not recorded"):
      finished(corrected)
  pretrained = tmp_path / "pretrained"   # a pretraining run's workdir: refused before anything is written there
  (pretrained / "checkpoints").mkdir(parents=True)
  with pytest.raises(failures.UserError, match="holds a pretraining run \\(checkpoints\\), not a finetuning run"):
    run_workdir.finished(config, str(pretrained))
  assert os.listdir(pretrained) == ["checkpoints"]



@pytest.mark.slow
def test_tweets_without_num_labels_and_with_labels_given(tweets, tmp_path):
  results = trainer.finetune(tweet_config(tweets), str(tmp_path / "read"))
  assert results["finished"] and set(results["best_metrics"]) == {"accuracy"}
  read = json.loads((tmp_path / "read" / "task.json").read_text())
  assert read["label_names"] == ["negative", "neutral", "positive"]
  trainer.finetune(tweet_config(tweets, labels="positive,neutral,negative"), str(tmp_path / "given"))
  given = json.loads((tmp_path / "given" / "task.json").read_text())
  assert given["label_names"] == ["positive", "neutral", "negative"]  # ids in the order given


# ------------------------------------------------------------------------------------------------
# Unusable files: one paragraph naming the file and what to do, before the model is loaded.


def _copy(src, dst, **replace):
  """The tweet files in `dst`, with `replace[name]` (bytes) instead of file `name`."""
  os.makedirs(dst, exist_ok=True)
  for name in os.listdir(src):
    with open(os.path.join(src, name), "rb") as f:
      data = f.read()
    with open(os.path.join(dst, name), "wb") as f:
      f.write(replace.get(name.replace(".", "_"), data))
  return str(dst)


def _drop_column(path, column) -> bytes:
  with open(path) as f:
    rows = [line.rstrip("\n").split(",") for line in f]
  keep = [i for i, name in enumerate(rows[0]) if name != column]
  return "".join(",".join(r[i] for i in keep) + "\n" for r in rows).encode()


def _bad_files(tweets):
  train, dev = os.path.join(tweets, "train.csv"), os.path.join(tweets, "dev.csv")
  with open(dev, "rb") as f:
    dev_bytes = f.read()
  return {
      "train_without_labels": ({"train_csv": _drop_column(train, "sentiment")}, {},
                               r"train.csv has no label column 'sentiment' \(its columns: id, text\)"),
      "misspelt_label_option": ({}, {"label": "sentimnet"}, r"train.csv has no label column 'sentimnet'.*"
                                r"--config.task_opts.label=COLUMN"),
      "misspelt_text_option": ({}, {"text_a": "txt"}, r"train.csv has no text column 'txt'.*"
                               r"--config.task_opts.text_a=COLUMN "
                               r"\(`bert-jax predict` and `analyze prune`: --text_a=COLUMN\)"),
      "dev_without_labels": ({"dev_csv": _drop_column(dev, "sentiment")}, {}, r"dev.csv has no label column"),
      "empty_dev": ({"dev_csv": b""}, {}, r"dev.csv is empty: it needs a header line"),
      "header_only_dev": ({"dev_csv": b"id,text,sentiment\n"}, {}, r"dev.csv has a header line but no examples"),
      "latin1_byte": ({"dev_csv": dev_bytes.replace(b"movie", b"caf\xe9", 1)}, {},
                      r"dev.csv, line 2: byte 0xe9 is not UTF-8.*iconv"),
      "dev_label_unseen": ({"dev_csv": dev_bytes.replace(b"neutral", b"angry", 1)}, {},
                           r"dev.csv: label 'angry' is not in the label set"),
  }


@pytest.mark.parametrize("case", ["train_without_labels", "misspelt_label_option", "misspelt_text_option",
                                  "dev_without_labels",
                                  "empty_dev", "header_only_dev", "latin1_byte", "dev_label_unseen"])
def test_unusable_files_stop_before_training_naming_the_file(tweets, tmp_path, case):
  files, opts, message = _bad_files(tweets)[case]
  config = tweet_config(_copy(tweets, tmp_path / "data", **files), **opts)
  with pytest.raises(readers.DataError, match=message) as error:
    trainer.finetune(config, str(tmp_path / "run"))
  assert "\n" not in str(error.value)  # one paragraph
  assert not os.path.exists(tmp_path / "run")  # nothing loaded, compiled or written


def test_fewer_training_examples_than_a_batch_is_said_before_training(tweets, tmp_path):
  config = tweet_config(tweets)
  config.batch_size = 64
  with pytest.raises(failures.UserError, match="48 training examples, fewer than batch_size 64: lower "
                     "--config.batch_size or give more data"):
    trainer.finetune(config, str(tmp_path / "run"))


@pytest.mark.slow
def test_the_command_prints_the_paragraph_without_a_traceback(tweets, tmp_path):
  data = _copy(tweets, tmp_path / "data", dev_csv=b"id,text,sentiment\n")
  argv = [sys.executable, "-m", "bert_jax.cli", "finetune", "--config=configs/finetune/generic.py:single",
          f"--workdir={tmp_path}/run", f"--config.data_dir={data}", "--config.task_opts.text_a=text",
          "--config.task_opts.label=sentiment", f"--config.vocab_file={data}/vocab.txt"]
  run = subprocess.run(argv, cwd=ROOT, env=_user_env(), capture_output=True, text=True, timeout=300)
  assert run.returncode == 2
  assert "Traceback" not in run.stderr
  assert run.stderr.strip().splitlines()[-1].startswith("bert-jax finetune: ") and "dev.csv has a header" in run.stderr


def test_a_cased_tokenization_of_an_uncased_vocabulary_is_refused(tmp_path):
  """CoNLL-2003's config tokenizes cased; on an uncased checkpoint every capitalised word would be [UNK]."""
  from configs.finetune import conll2003  # pylint: disable=import-outside-toplevel
  write_vocab(tmp_path / "uncased")
  c = conll2003.get_config()
  c.vocab_file = str(tmp_path / "uncased" / "vocab.txt")
  with pytest.raises(failures.UserError, match="uncased .*set --config.do_lower_case=True"):
    init.load_tokenizer(c)
  c.do_lower_case = True
  assert init.load_tokenizer(c).tokenize("The movie") == ["the", "movie"]
  (tmp_path / "cased").mkdir()
  (tmp_path / "cased" / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nThe\nmovie\n")
  c.vocab_file, c.do_lower_case = str(tmp_path / "cased" / "vocab.txt"), False
  assert init.load_tokenizer(c).tokenize("The movie") == ["The", "movie"]
  (tmp_path / "caseless").mkdir()   # a script without case: neither cased nor uncased
  (tmp_path / "caseless" / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n\u0e01\u0e02\n")
  c.vocab_file = str(tmp_path / "caseless" / "vocab.txt")
  assert init.load_tokenizer(c).tokenize("\u0e01\u0e02") == ["\u0e01\u0e02"]


def test_a_checkpoint_s_do_lower_case_is_followed_unless_the_config_sets_it(tmp_path):
  """A cased checkpoint's tokenizer_config.json says do_lower_case false; lowercasing its text would lose the
  case the checkpoint was trained on (Hugging Face's from_pretrained follows the file too)."""
  (tmp_path / "cased").mkdir()
  (tmp_path / "cased" / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nThe\nthe\nmovie\n")
  (tmp_path / "cased" / "tokenizer_config.json").write_text('{"do_lower_case": false}')
  c = generic.get_config("single")
  c.vocab_file = str(tmp_path / "cased" / "vocab.txt")
  assert init.load_tokenizer(c).tokenize("The movie") == ["The", "movie"]
  c.do_lower_case = True
  assert init.load_tokenizer(c).tokenize("The movie") == ["the", "movie"]
  c.vocab_file, c.do_lower_case = "", None
  c.init_checkpoint = str(tmp_path / "cased")
  (tmp_path / "cased" / "config.json").write_text("{}")
  assert init.load_tokenizer(c).tokenize("The movie") == ["The", "movie"]
  c.vocab_file = str(tmp_path / "cased")   # a folder as the vocabulary: its own tokenizer_config.json
  assert init.load_tokenizer(c).tokenize("The movie") == ["The", "movie"]
  (tmp_path / "cased" / "tokenizer_config.json").unlink()   # no word from the checkpoint: lowercased
  assert init.load_tokenizer(c).tokenize("The movie") == ["the", "movie"]
  (tmp_path / "uncased").mkdir()   # a file that says false beside an uncased vocabulary: named as the cause
  (tmp_path / "uncased" / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\nmovie\n")
  (tmp_path / "uncased" / "tokenizer_config.json").write_text('{"do_lower_case": false}')
  c.vocab_file, c.init_checkpoint = str(tmp_path / "uncased" / "vocab.txt"), ""
  with pytest.raises(failures.UserError, match="^the tokenizer_config.json of config.vocab_file says do_lower_case "
                     "false but the vocabulary"):
    init.load_tokenizer(c)


@pytest.mark.parametrize("field, value", [("max_seq_length", 0), ("max_seq_length", -1), ("batch_size", 0),
                                          ("num_epochs", 0), ("log_every_steps", 0), ("eval_batch_size", -4),
                                          ("eval_every_steps", -1), ("warmup_fraction", 1.5)])
def test_a_finetuning_field_out_of_range_is_named_before_anything_is_read(tmp_path, field, value):
  c = generic.get_config("single")
  c.data_dir = str(tmp_path / "not_read")
  c[field] = value
  with pytest.raises(failures.UserError, match=rf"invalid finetuning config:\n  {field} {value!r}: .*--config.{field}"):
    trainer.finetune(c, str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()


def test_an_unknown_task_and_a_sequence_longer_than_the_positions_are_user_errors(tweets, tmp_path):
  c = tweet_config(tweets)
  c.task = "sst3"
  with pytest.raises(failures.UserError, match="config.task 'sst3': unknown task"):
    trainer.finetune(c, str(tmp_path / "task"))
  c = tweet_config(tweets)
  c.max_seq_length = c.model.max_position_embeddings + 1
  with pytest.raises(failures.UserError, match=rf"max_seq_length {c.max_seq_length} is longer than the model's "
                                               rf"position table holds \({c.max_seq_length - 1} tokens"):
    trainer.finetune(c, str(tmp_path / "positions"))
  c = tweet_config(tweets)   # a vocabulary with ids past the embedding table
  c.model.vocab_size = init.load_tokenizer(c).vocab_size - 1
  with pytest.raises(failures.UserError, match=rf"has {c.model.vocab_size + 1} tokens but the model's embedding "
                                               rf"table has {c.model.vocab_size}: use the checkpoint's own"):
    trainer.finetune(c, str(tmp_path / "vocabulary"))
  assert not (tmp_path / "vocabulary").exists()

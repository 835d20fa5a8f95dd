"""Classification/regression tasks: readers of every GLUE format, generic files, TFDS, features, scores."""

import json
from unittest import mock

import numpy as np
import pytest

from bert_jax.finetune import tasks
from bert_jax.finetune.readers import DataError
from tests.conftest import shared_path


@pytest.fixture(scope="module")
def tokenizer():
  from bert_jax.data.tokenizer import load_tokenizer  # pylint: disable=g-import-not-at-top
  return load_tokenizer(str(shared_path("minilm", "vocab.txt")))


def _write(path, lines):
  path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
  return path


# Header and one row of each GLUE file, as distributed (download_glue_data.py).
_GLUE_FILES = {
    "cola": (["gj04\t1\t\tOur friends won't buy this analysis, let alone the next one we propose.",
              "gj04\t0\t*\tOne more pseudo generalization and I'm giving up."], "dev.tsv"),
    "sst2": (["sentence\tlabel", "it 's a charming and often affecting journey . \t1"], "dev.tsv"),
    "mrpc": (["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String",
              "1\t1355540\t1355592\tHe said \"yes.\tHe agreed."], "dev.tsv"),
    "stsb": (["index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore",
              "0\tmain-captions\tMSRvid\t2012test\t0000\tnone\tnone\tA man with a hard hat is dancing.\t"
              "A man wearing a hard hat is dancing.\t5.000"], "dev.tsv"),
    "qqp": (["id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate",
             "201359\t303345\t303346\tWhy are African-Americans so beautiful?\tWhy are hispanics so beautiful?\t0"],
            "dev.tsv"),
    "mnli": (["index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse"
              "\tsentence2_parse\tsentence1\tsentence2\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label",
              "0\t63735\t63735n\tslate\t( x )\t( y )\t(ROOT x)\t(ROOT y)\tThe new rights are nice enough\t"
              "Everyone really likes the newest benefits \tneutral\tentailment\tneutral\tneutral\tneutral\tneutral"],
             "dev_matched.tsv"),
    "qnli": (["index\tquestion\tsentence\tlabel",
              "0\tWhat came into force after the new constitution was herald?\tAs of that day, the new "
              "constitution heralding the Second Republic came into force.\tentailment"], "dev.tsv"),
    "rte": (["index\tsentence1\tsentence2\tlabel", "0\tDana Reeve died.\tChristopher Reeve had an accident.\t"
             "not_entailment"], "dev.tsv"),
    "wnli": (["index\tsentence1\tsentence2\tlabel", "0\tThe drain is clogged with hair.\tThe hair has to be "
              "cleaned.\t1"], "dev.tsv"),
}
_EXPECTED = {"cola": ("Our friends won't buy this analysis, let alone the next one we propose.", None, "1"),
             "sst2": ("it 's a charming and often affecting journey . ", None, "1"),
             "mrpc": ('He said "yes.', "He agreed.", "1"),
             "stsb": ("A man with a hard hat is dancing.", "A man wearing a hard hat is dancing.", 5.0),
             "qqp": ("Why are African-Americans so beautiful?", "Why are hispanics so beautiful?", "0"),
             "mnli": ("The new rights are nice enough", "Everyone really likes the newest benefits ", "neutral"),
             "qnli": ("What came into force after the new constitution was herald?",
                      "As of that day, the new constitution heralding the Second Republic came into force.",
                      "entailment"),
             "rte": ("Dana Reeve died.", "Christopher Reeve had an accident.", "not_entailment"),
             "wnli": ("The drain is clogged with hair.", "The hair has to be cleaned.", "1")}


@pytest.mark.parametrize("name", sorted(_GLUE_FILES))
def test_reads_glue_tsv_formats(name, tmp_path):
  lines, filename = _GLUE_FILES[name]
  _write(tmp_path / filename, lines)
  task = tasks.get_task(name)
  split = filename[:-4]
  assert split in task.splits
  first = task.read(split, str(tmp_path))[0]  # the directory ...
  assert (first.text_a, first.text_b, first.label) == _EXPECTED[name]
  assert task.read(split, str(tmp_path / filename))[0] == first  # ... or the file itself
  assert task.kind == ("regression" if name == "stsb" else "classification")
  assert task.num_labels == (1 if name == "stsb" else 3 if name == "mnli" else 2)


@pytest.mark.parametrize("name,filename", [("mrpc", "dev.tsv"), ("csv", "train.csv"), ("jsonl", "train.jsonl")])
def test_byte_order_mark_is_not_part_of_the_first_column(name, filename, tmp_path):
  rows = {"mrpc": _GLUE_FILES["mrpc"][0], "csv": ["label,sentence", "1,Fine."],
          "jsonl": ['{"label": "1", "sentence": "Fine."}']}[name]
  (tmp_path / filename).write_text("\ufeff" + "".join(r + "\n" for r in rows), encoding="utf-8")
  task = tasks.get_task(name) if name == "mrpc" else tasks.get_task(name, labels=("0", "1"))
  assert task.read(filename.split(".")[0], str(tmp_path))[0].label == "1"


def test_glue_task_table():
  expected = {"cola": "mcc", "sst2": "accuracy", "mrpc": "f1", "stsb": "pearson", "qqp": "f1",
              "mnli": "accuracy", "qnli": "accuracy", "rte": "accuracy", "wnli": "accuracy",
              "squad_v1": "f1", "squad_v2": "f1", "conll2003": "f1"}
  for name, metric in expected.items():
    assert tasks.get_task(name).primary_metric == metric
  assert tasks.get_task("MNLI").splits == ("train", "dev_matched", "dev_mismatched")
  assert tasks.get_task("STS-B").name == "stsb"
  with pytest.raises(ValueError, match="unknown task"):
    tasks.get_task("glue")


def test_reads_glue_test_files_without_labels(tmp_path):
  _write(tmp_path / "test.tsv", ["index\tsentence1\tsentence2", "7\tA b.\tC d."])
  (example,) = tasks.get_task("rte").read("test", str(tmp_path))
  assert (example.guid, example.label) == ("7", None)


def test_reads_quora_release_format():
  path = shared_path("tasks", "format_samples", "quora_paraphrase.tsv")
  examples = tasks.get_task("qqp").read("dev", str(path))
  assert [e.label for e in examples] == ["1", "0", "1"]
  assert examples[2].text_a == "How can one root android devices ?"
  assert examples[2].text_b == "How do I root an Android device ?" and examples[2].guid == "391187"


@pytest.mark.parametrize("name,header,row,expected", [
    ("cola", "sentence\tlabel", "The boy ran home.\t1", ("The boy ran home.", None, "1")),
    ("cola", "sentence,label", '"Home, the boy ran.",0', ("Home, the boy ran.", None, "0")),
    ("qqp", "id,question1,question2,is_duplicate", "7,How do I cook rice?,How is rice cooked?,1",
     ("How do I cook rice?", "How is rice cooked?", "1")),
    ("qqp", "id\tquestion1\tquestion2", "7\tHow do I cook rice?\tHow is rice cooked?",
     ("How do I cook rice?", "How is rice cooked?", None)),
])
def test_cola_and_qqp_read_a_file_that_names_its_columns(tmp_path, name, header, row, expected):
  """CoLA's and Quora's own formats have no header; a TSV or CSV that names the task's columns is read by
  them, as every task's (CoLA's read as headerless crashed on it, Quora's CSV gave no examples)."""
  path = tmp_path / ("dev.csv" if "," in header else "dev.tsv")
  path.write_text(f"{header}\n{row}\n")
  [example] = tasks.get_task(name).read("predict", str(path))
  assert (example.text_a, example.text_b, example.label) == expected


def test_glue_tasks_read_the_text_columns_the_options_name(tmp_path):
  """`task_opts.text_a` (and `predict --text_a`) renames a GLUE task's text column, as the missing-column
  error says; it was ignored."""
  (tmp_path / "dev.tsv").write_text("text\tlabel\nA fine film.\t1\n")
  with pytest.raises(DataError, match="task_opts.text_a"):
    tasks.get_task("sst2").read("dev", str(tmp_path / "dev.tsv"))
  [example] = tasks.get_task("sst2", text_a="text").read("dev", str(tmp_path / "dev.tsv"))
  assert (example.text_a, example.label) == ("A fine film.", "1")


def test_quora_release_rows_with_a_missing_field_are_skipped(tmp_path):
  """As the GLUE header's rows with a missing field (Hugging Face's QqpProcessor skips them too)."""
  _write(tmp_path / "dev.tsv", ["1\tWhat is it ?\tWhat is this ?\t5", "0\tA question alone", "0\tA ?\tB ?\t7"])
  assert [e.guid for e in tasks.get_task("qqp").read("dev", str(tmp_path / "dev.tsv"))] == ["5", "7"]


@pytest.mark.parametrize("name", ["snli", "mnli"])
def test_reads_nli_json_lines(name):
  path = shared_path("tasks", "format_samples", "snli.jsonl")
  examples = tasks.get_task(name).read("dev", str(path))
  assert [e.label for e in examples] == ["neutral", "contradiction", "entailment"]
  assert examples[0].text_a == "A person on a horse jumps over a broken down airplane."
  assert examples[0].text_b == "A person is training his horse for a competition."


def test_nli_drops_examples_without_consensus(tmp_path):
  _write(tmp_path / "dev.jsonl", ['{"sentence1": "a", "sentence2": "b", "gold_label": "-"}',
                                  '{"sentence1": "c", "sentence2": "d", "gold_label": "neutral"}'])
  assert [e.text_a for e in tasks.get_task("snli").read("dev", str(tmp_path))] == ["c"]


def test_snli_reads_its_release_folder(tmp_path):
  """snli_1.0/ as released: snli_1.0_{split}.jsonl beside .txt (a TSV with a header), as the config says."""
  (tmp_path / "snli_1.0_dev.txt").write_text("gold_label\tsentence1\tsentence2\tpairID\nneutral\ta\tb\tp1\n")
  (tmp_path / "snli_1.0_train.jsonl").write_text('{"sentence1": "c", "sentence2": "d", "gold_label": "entailment"}\n')
  task = tasks.get_task("snli")
  assert [(e.guid, e.text_a, e.label) for e in task.read("dev", str(tmp_path))] == [("p1", "a", "neutral")]
  assert [e.text_b for e in task.read("train", str(tmp_path))] == ["d"]


def test_rotten_tomatoes_as_sst2(tokenizer):
  source = str(shared_path("tasks", "rotten_tomatoes"))
  task = tasks.get_task("sst2")
  train, dev = task.read("train", source), task.read("dev", source)
  assert (len(train), len(dev)) == (11752, 1000)
  assert {e.label for e in dev} == {"0", "1"} and all(e.text_b is None for e in dev)
  features, meta = task.featurize(dev, tokenizer, max_seq_length=64)
  assert set(features) == {"input_ids", "input_mask", "segment_ids", "label"}
  for key in ("input_ids", "input_mask", "segment_ids"):
    assert features[key].shape == (1000, 64) and features[key].dtype == np.int32
  assert features["label"].dtype == np.int32 and features["label"].sum() == 597
  lengths = features["input_mask"].sum(1)
  assert np.all(features["input_ids"][:, 0] == tokenizer.cls_id)
  assert np.all(features["input_ids"][np.arange(1000), lengths - 1] == tokenizer.sep_id)
  assert np.all(features["input_ids"][features["input_mask"] == 0] == tokenizer.pad_id)
  ids, _ = tokenizer.encode_pair(dev[0].text_a, max_length=64)
  assert features["input_ids"][0, :len(ids)].tolist() == ids
  assert np.array_equal(meta["example_index"], np.arange(1000))


def test_pair_features_segments(tokenizer, tmp_path):
  _write(tmp_path / "dev.tsv", _GLUE_FILES["rte"][0])
  task = tasks.get_task("rte")
  features, _ = task.featurize(task.read("dev", str(tmp_path)), tokenizer, max_seq_length=32)
  ids, segments = tokenizer.encode_pair("Dana Reeve died.", "Christopher Reeve had an accident.", 32)
  assert features["input_ids"][0, :len(ids)].tolist() == ids
  assert features["segment_ids"][0, :len(ids)].tolist() == segments and 1 in segments


@pytest.mark.parametrize("fmt,lines", [
    ("tsv", ["id\ttext\tscore\tcls", "a\tgood film\t0.5\tpos", "b\tbad film\t-1\tneg"]),
    ("csv", ["id,text,score,cls", 'a,"good film",0.5,pos', "b,bad film,-1,neg"]),
    ("jsonl", ['{"id": "a", "text": "good film", "score": 0.5, "cls": "pos"}',
               '{"id": "b", "text": "bad film", "score": -1, "cls": "neg"}']),
])
def test_generic_named_columns(fmt, lines, tmp_path, tokenizer):
  _write(tmp_path / f"train.{fmt}", lines)
  task = tasks.get_task(fmt, text_a="text", label="cls", labels=["neg", "pos"], guid="id")
  examples = task.read("train", str(tmp_path))
  assert [(e.guid, e.text_a, e.label) for e in examples] == [("a", "good film", "pos"), ("b", "bad film", "neg")]
  assert task.kind == "classification" and task.primary_metric == "accuracy"
  regression = tasks.get_task(fmt, text_a="text", label="score", num_labels=1)
  assert regression.kind == "regression" and regression.num_labels == 1
  assert [e.label for e in regression.read("train", str(tmp_path))] == [0.5, -1.0]
  features, meta = regression.featurize(regression.read("train", str(tmp_path)), tokenizer, 16)
  assert features["label"].dtype == np.float32
  scores = regression.evaluate(np.array([[0.4], [-0.9]]), regression.read("train", str(tmp_path)), meta)
  assert scores["pearson"] == pytest.approx(1.0) and scores["spearman"] == pytest.approx(1.0)


def test_generic_labels_come_from_the_training_file(tmp_path):
  _write(tmp_path / "train.csv", ["text,sentiment", "a,positive", "b,negative", "c,neutral", "d,positive"])
  _write(tmp_path / "dev.csv", ["text,sentiment", "e,neutral", "f,angry"])
  task = tasks.get_task("generic", text_a="text", label="sentiment")
  assert task.label_names == () and task.kind == "classification"
  train, dev = task.read("train", str(tmp_path)), task.read("dev", str(tmp_path))
  path = task.file("train", str(tmp_path))
  assert path == str(tmp_path / "train.csv")
  resolved = task.with_labels_from(train, path)
  assert resolved.label_names == ("negative", "neutral", "positive") and resolved.num_labels == 3  # sorted
  assert resolved.primary_metric == "accuracy"
  with pytest.raises(DataError, match=r"dev.csv: label 'angry' is not in the label set"):
    resolved.check_labelled(dev, task.file("dev", str(tmp_path)))
  # Counted against num_labels when that is given; given labels keep their order.
  assert tasks.get_task("generic", text_a="text", label="sentiment", num_labels=3).with_labels_from(
      train, path).label_names == ("negative", "neutral", "positive")
  with pytest.raises(DataError, match=r"3 distinct labels .*num_labels is 2.*task_opts.labels=negative,neutral"):
    tasks.get_task("generic", text_a="text", label="sentiment", num_labels=2).with_labels_from(train, path)
  given = tasks.get_task("generic", text_a="text", label="sentiment", labels="positive,negative,neutral")
  assert given.with_labels_from(train, path).label_names == ("positive", "negative", "neutral")
  with pytest.raises(DataError, match="'neutral' is not in the label set"):
    tasks.get_task("generic", text_a="text", label="sentiment", labels=["positive", "negative"]).with_labels_from(
        train, path)
  numbers = [tasks.readers.PairExample(str(i), "x", label=y) for i, y in enumerate(["10", "2", "1"])]
  assert tasks.get_task("generic").with_labels_from(numbers, "f").label_names == ("1", "2", "10")


def test_evaluate_and_write_predictions(tokenizer, tmp_path):
  lines = ["index\tsentence1\tsentence2\tlabel"] + [
      f"{i}\tA{i}.\tB{i}.\t{label}" for i, label in enumerate(["0", "1", "1", "0", "1"])]
  _write(tmp_path / "dev.tsv", lines)
  task = tasks.get_task("wnli")
  examples = task.read("dev", str(tmp_path))
  features, meta = task.featurize(examples, tokenizer, 16)
  logits = np.eye(2)[[0, 1, 0, 0, 1]] * 3.0  # one mistake (example 2)
  assert task.evaluate(logits, examples, meta) == {"accuracy": pytest.approx(0.8)}
  task.write_predictions(str(tmp_path / "WNLI.tsv"), logits, examples, meta)
  assert (tmp_path / "WNLI.tsv").read_text().splitlines() == [
      "index\tprediction", "0\t0", "1\t1", "2\t0", "3\t0", "4\t1"]
  cola = tasks.get_task("cola")
  scores = cola.evaluate(np.eye(2)[features["label"]], examples, meta)
  assert scores == {"mcc": 1.0, "accuracy": 1.0}


def test_tfds_not_prepared_is_a_clear_error(tmp_path):
  pytest.importorskip("tensorflow_datasets")
  with pytest.raises(FileNotFoundError, match="not prepared"):
    tasks.get_task("sst2").read("dev", "tfds", data_dir=str(tmp_path))
  with pytest.raises(ValueError, match="data_dir"):
    tasks.get_task("squad_v1").read("dev", "tfds")


def test_tfds_as_a_finetuning_config_names_it(tmp_path, monkeypatch):
  """`--config.data_dir=tfds --config.task_opts.tfds_data_dir=DIR`, relative as typed, reach the reader as the
  task's own dataset in DIR; without DIR the error names the field to set."""
  pytest.importorskip("tensorflow_datasets")
  from bert_jax import failures, paths  # pylint: disable=g-import-not-at-top
  from configs.finetune import sst2  # pylint: disable=g-import-not-at-top
  monkeypatch.chdir(tmp_path)
  config = sst2.get_config()
  config.data_dir, config.task_opts.tfds_data_dir = "tfds", "tfds_data"
  config = paths.absolute_config(config, paths.FINETUNE_FIELDS)
  assert config.data_dir == "tfds" and config.task_opts.tfds_data_dir == str(tmp_path / "tfds_data")
  with pytest.raises(FileNotFoundError, match=f"'glue/sst2' is not prepared in {tmp_path}/tfds_data"):
    tasks.get_task(config.task, **config.task_opts).read("dev", config.data_dir)
  with pytest.raises(failures.UserError, match=r"needs an explicit data_dir \(--config.task_opts.tfds_data_dir\)"):
    tasks.get_task(config.task, **dict(config.task_opts, tfds_data_dir="")).read("dev", config.data_dir)


def test_tfds_glue_with_mock_data(tmp_path):
  tfds = pytest.importorskip("tensorflow_datasets")
  with tfds.testing.mock_data(num_examples=4, policy=tfds.testing.MockPolicy.USE_CODE), \
       mock.patch.object(tfds.core.DatasetBuilder, "is_prepared", return_value=True):
    mnli = tasks.get_task("mnli", tfds_data_dir=str(tmp_path)).read("dev_mismatched", "tfds")
    stsb = tasks.get_task("stsb").read("dev", "tfds:glue/stsb", data_dir=str(tmp_path))
    mrpc = tasks.get_task("mrpc").read("train", "tfds", data_dir=str(tmp_path))
    snli = tasks.get_task("snli").read("train", "tfds", data_dir=str(tmp_path))  # tfds `snli`, not glue
  assert len(mnli) == 4 and all(e.label in tasks.get_task("mnli").label_names for e in mnli)
  assert all(isinstance(e.text_a, str) and isinstance(e.text_b, str) for e in mnli)
  assert all(isinstance(e.label, float) for e in stsb)
  assert all(e.label in ("0", "1") and e.text_b is not None for e in mrpc)
  assert all(e.label in tasks.get_task("snli").label_names for e in snli)


def test_test_split_cannot_be_evaluated_but_can_be_written(tokenizer, tmp_path):
  _write(tmp_path / "test.tsv", ["index\tsentence1\tsentence2", "3\tA b.\tC d.", "9\tE f.\tG h."])
  for name, logits, expected in (("stsb", [[4.25], [0.5]], ["3\t4.250", "9\t0.500"]),
                                 ("mnli", [[0, 1, 0], [0, 0, 1]], ["3\tentailment", "9\tneutral"])):
    task = tasks.get_task(name)
    examples = task.read("test", str(tmp_path))
    _, meta = task.featurize(examples, tokenizer, 16)
    with pytest.raises(ValueError, match="without labels"):
      task.evaluate(np.array(logits), examples, meta)
    task.write_predictions(str(tmp_path / f"{name}.tsv"), np.array(logits), examples, meta)
    assert (tmp_path / f"{name}.tsv").read_text().splitlines() == ["index\tprediction"] + expected


def test_a_row_with_more_fields_than_its_header_is_an_error(tmp_path):
  """A CSV field holding an unquoted comma (or a tab in a TSV text) would shift the label or be cut off:
  the line is named. Trailing empty fields are harmless."""
  from bert_jax.finetune import readers  # pylint: disable=g-import-not-at-top
  (tmp_path / "a.csv").write_text('label,sentence\npos,"great fun, really"\npos,fine,\n')
  assert [r["sentence"] for r in readers.read_rows(str(tmp_path / "a.csv"))] == ["great fun, really", "fine"]
  (tmp_path / "b.csv").write_text("label,sentence\npos,great fun, really\n")
  with pytest.raises(DataError, match=r"b.csv, line 2: 3 fields under a header of 2 \(quote"):
    readers.read_rows(str(tmp_path / "b.csv"))
  (tmp_path / "c.tsv").write_text("sentence\tlabel\ngreat\tfun\tpositive\n")
  with pytest.raises(DataError, match="line 2: 3 fields under a header of 2 .a text field may not hold a tab"):
    readers.read_rows(str(tmp_path / "c.tsv"))


def test_json_lines_split_at_newlines_only(tmp_path):
  """A JSON string may hold U+2028, U+2029 or U+0085 raw, which str.splitlines would split a line at."""
  from bert_jax.finetune import readers  # pylint: disable=g-import-not-at-top
  text = "first line\u2028second\u0085third"
  (tmp_path / "a.jsonl").write_text(json.dumps({"sentence": text, "label": "pos"}, ensure_ascii=False) + "\r\n",
                                    encoding="utf-8")
  assert readers.read_rows(str(tmp_path / "a.jsonl")) == [{"sentence": text, "label": "pos"}]

"""`bert-jax predict` on finetuned workdirs: the finetuning's own dev accuracy again, tags, answer spans."""

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import pytest

from bert_jax import failures
from bert_jax.tools import predict
from bert_jax.finetune import ner
from bert_jax.finetune import readers
from bert_jax.finetune import trainer
from configs.finetune import generic, squad_v1
from conftest import assert_one_line_errors, shared_path
from test_finetune_tagging import make_tagging_data
from test_finetune_train import tiny_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tiny_on_minilm_vocab(config, data_dir, max_seq_length):
  c = tiny_config(data_dir, config, vocab_file=str(shared_path("minilm", "vocab.txt")))
  c.model.vocab_size, c.model.max_position_embeddings, c.max_seq_length = 30522, max_seq_length, max_seq_length
  return c


@pytest.mark.slow
def test_predict_gives_the_finetuning_dev_accuracy_on_rotten_tomatoes(tmp_path, minilm_rotten_tomatoes):
  """A short finetune (MiniLM, 30 steps on 960 sentences; conftest.py), then the command on the whole dev file."""
  data = shared_path("tasks", "rotten_tomatoes")
  run_dir, results = minilm_rotten_tomatoes
  argv = [sys.executable, "-m", "bert_jax.cli", "predict", f"--checkpoint={run_dir}",
          f"--input={data}/dev.tsv", f"--output={tmp_path}/new/dev_predictions.tsv"]   # a folder not there yet
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  run = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert run.returncode == 0, run.stderr[-3000:]
  summary = json.loads(run.stdout[run.stdout.index("{"):])
  print("finetune dev accuracy", results["best_metrics"]["accuracy"], "predict", summary["metrics"]["accuracy"])
  assert summary["examples"] == 1000
  assert summary["metrics"]["accuracy"] == results["best_metrics"]["accuracy"] > 0.6  # above the 0.597 majority
  rows = readers.read_rows(str(tmp_path / "new" / "dev_predictions.tsv"))
  assert len(rows) == 1000 and set(rows[0]) == {"id", "label", "p_0", "p_1"}
  finetuning = readers.read_rows(str(run_dir / "predictions_dev.tsv"))  # the best evaluation's
  assert [r["label"] for r in rows] == [r["prediction"] for r in finetuning]
  assert abs(float(rows[0]["p_0"]) + float(rows[0]["p_1"]) - 1.0) < 1e-5


@pytest.mark.slow
def test_predict_writes_tags_per_word_on_a_tagging_workdir(tmp_path, capsys):
  data = make_tagging_data(tmp_path / "data")
  c = _tiny_on_minilm_vocab(generic.get_config("tagging"), data, 32)
  c.batch_size, c.num_epochs, c.learning_rate = 8, 4, 3e-3
  results = trainer.finetune(c, str(tmp_path / "run"))
  predictor = predict.Predictor.load(str(tmp_path / "run"))
  (tmp_path / "new.jsonl").write_text('{"tokens": ["Ekeus", "lives", "in", "Baghdad", "."]}\n'
                                      '{"text": "U.N. official heads for Seattle"}\n')
  examples = predictor.read(str(tmp_path / "new.jsonl"))
  out = predictor.predict(examples, batch_size=4)
  assert [r["words"] for r in out] == [["Ekeus", "lives", "in", "Baghdad", "."],
                                       ["U.N.", "official", "heads", "for", "Seattle"]]
  assert all(len(r["tags"]) == len(r["words"]) for r in out)
  assert {t for r in out for t in r["tags"]} <= {"B-AGENCY", "B-HUMAN", "B-SITE", "O"}
  # A sentence past the 32-token window: every word tagged, a window at a time (it tagged "O" past the first).
  long = dataclasses.replace(examples[0], words=examples[0].words * 8)
  (tagged,) = predictor.predict([long])
  runs, _ = ner.windows([long], predictor.tokenizer, predictor.max_seq_length)
  assert len(runs) > 1 and len(tagged["tags"]) == len(long.words) == 40
  assert tagged["tags"] == sum((r["tags"] for r in predictor.predict(runs)), [])
  # The dev file itself (with its tags): the finetuning's own scores.
  dev = predictor.read(os.path.join(data, "dev.conll"))
  scores = predictor.score(dev, predictor.predict(dev))
  assert scores["token_accuracy"] == pytest.approx(results["last_metrics"]["token_accuracy"])
  predict.write(str(tmp_path / "tags.tsv"), out)
  assert (tmp_path / "tags.tsv").read_text().splitlines()[0] == "id\twords\ttags"
  # A run that did not finish: its best checkpoint so far, said; none yet, said so.
  capsys.readouterr()
  results = (tmp_path / "run" / trainer.RESULTS_FILE).read_text()
  (tmp_path / "run" / trainer.RESULTS_FILE).unlink()
  predict.task_record(str(tmp_path / "run" / "best"))
  assert "holds a finetuning run that did not finish" in capsys.readouterr().err
  (tmp_path / "run" / "metrics.jsonl").unlink()   # as an export (prune's): no run's log, no results, no warning
  predict.task_record(str(tmp_path / "run"))
  assert capsys.readouterr().err == ""
  shutil.rmtree(tmp_path / "run" / "best")
  with pytest.raises(FileNotFoundError, match="holds a finetuning run that saved no checkpoint yet"):
    predict.task_record(str(tmp_path / "run"))
  (tmp_path / "run" / trainer.RESULTS_FILE).write_text(results)
  with pytest.raises(FileNotFoundError, match=r"finished without keeping a checkpoint \(keep_best_checkpoint False"):
    predict.task_record(str(tmp_path / "run"))


@pytest.mark.slow
def test_predict_writes_answer_spans_on_a_qa_workdir(tmp_path):
  squad = json.loads(shared_path("tasks", "format_samples", "squad.json").read_text(encoding="utf-8"))
  squad["data"] = [dict(article, title=f"{article['title']}_{i}") for i in range(4) for article in squad["data"]]
  (tmp_path / "squad.json").write_text(json.dumps(squad), encoding="utf-8")
  c = _tiny_on_minilm_vocab(squad_v1.get_config(), str(tmp_path / "squad.json"), 128)
  c.task_opts.doc_stride, c.batch_size, c.num_epochs = 64, 8, 1
  trainer.finetune(c, str(tmp_path / "run"))
  predictor = predict.Predictor.load(str(tmp_path / "run" / "best"))
  paragraph = squad["data"][0]["paragraphs"][0]
  question = paragraph["qas"][0]["question"]
  (tmp_path / "questions.jsonl").write_text(json.dumps({"id": "q1", "question": question,
                                                        "context": paragraph["context"]}) + "\n")
  (result,) = predictor.predict(predictor.read(str(tmp_path / "questions.jsonl")))
  assert result["id"] == "q1" and result["answer"] and result["answer"] in paragraph["context"]


def test_a_pretraining_checkpoint_is_not_a_finetuned_workdir(tmp_path):
  (tmp_path / "config.json").write_text("{}")
  with pytest.raises(FileNotFoundError, match="not a finetuned workdir.*task.json"):
    predict.task_record(str(tmp_path))


def test_tagging_inputs_in_tsv_and_csv_cells_are_words(tmp_path):
  """A `tokens` or `tags` cell of a TSV / CSV is words split on whitespace (a JSON list as it is); the
  words and tags must pair up."""
  (tmp_path / "in.tsv").write_text("tokens\ttags\nJohn lives in Paris\tB-PER O O B-LOC\n")
  (tmp_path / "in.csv").write_text("id,tokens\n7,John lives\n")
  (tmp_path / "in.jsonl").write_text('{"tokens": ["New York"], "tags": ["B-LOC"]}\n')
  (ex,) = predict.read_words(str(tmp_path / "in.tsv"))
  assert ex.words == ("John", "lives", "in", "Paris") and ex.tags == ("B-PER", "O", "O", "B-LOC")
  (ex,) = predict.read_words(str(tmp_path / "in.csv"))
  assert ex.guid == "7" and ex.words == ("John", "lives") and ex.tags is None
  (ex,) = predict.read_words(str(tmp_path / "in.jsonl"))
  assert ex.words == ("New York",) and ex.tags == ("B-LOC",)
  (tmp_path / "bad.tsv").write_text("tokens\ttags\nJohn lives\tB-PER\n")
  with pytest.raises(readers.DataError, match="2 words and 1 tags"):
    predict.read_words(str(tmp_path / "bad.tsv"))


def _predictor(task):
  """A Predictor with no model: what `read` does with an input file."""
  return predict.Predictor(task, None, None, None, 16, False)


def test_a_row_without_its_label_is_predicted_in_its_place_and_refused_for_training(tmp_path):
  """Rows of a TSV that stop before the label column: predict keeps them where they are (the ids follow the
  input's rows); a training or dev file stops on the first, naming its line."""
  from bert_jax.finetune import tasks  # pylint: disable=g-import-not-at-top
  task = tasks.get_task("tsv", text_a="sentence").with_label_names(["0", "1"])
  (tmp_path / "dev.tsv").write_text("sentence\tlabel\nno label here\ngood\t1\n\nalso unlabelled\nbad\t0\n")
  examples = _predictor(task).read(str(tmp_path / "dev.tsv"))
  assert [(e.guid, e.text_a, e.label) for e in examples] == [
      ("0", "no label here", None), ("1", "good", "1"), ("2", "also unlabelled", None), ("3", "bad", "0")]
  with pytest.raises(readers.DataError, match=r"dev.tsv, line 2: 1 field under a header of 2 \(sentence, label\)"):
    task.read("dev", str(tmp_path / "dev.tsv"))
  (tmp_path / "quora.tsv").write_text("id\tquestion1\tquestion2\tis_duplicate\n0\ta?\tb?\t1\n1\tc?\n")
  assert len(tasks.get_task("qqp").read("train", str(tmp_path / "quora.tsv"))) == 1   # GLUE's QQP: skipped


def test_sentences_a_line_are_no_conll_columns_to_a_tagger(tmp_path):
  """A line of words would be read as CoNLL columns: its first word tagged, its last taken for a gold tag."""
  from bert_jax.finetune import tasks  # pylint: disable=g-import-not-at-top
  tagging = tasks.get_task("tagging").with_label_names(["O", "B-LOC", "I-LOC"])
  (tmp_path / "words.txt").write_text("Joel lives in Baghdad .\nU.N. official heads for Seattle now .\n")
  with pytest.raises(readers.DataError, match="words.txt: most lines' tag column holds no tag the model knows"):
    _predictor(tagging).read(str(tmp_path / "words.txt"))
  (tmp_path / "other_tags.conll").write_text("Paris CITY\nis NONE\n")   # another tag set, in columns: predicted
  assert [e.words for e in _predictor(tagging).read(str(tmp_path / "other_tags.conll"))] == [("Paris", "is")]


def test_conll_input_is_scored_against_the_tags_finetuning_read(tmp_path):
  """CoNLL-2003's files are IOB1: finetuning reads them as BIO (`tag_scheme`), and so does predict."""
  from bert_jax.finetune import tasks  # pylint: disable=g-import-not-at-top
  (tmp_path / "dev.txt").write_text("-DOCSTART- -X- -X- O\n\nEU NNP B-NP I-ORG\nrejects VBZ B-VP O\n"
                                    "German JJ B-NP I-MISC\ncall NN I-NP O\n")
  (ex,) = _predictor(tasks.get_task("conll2003")).read(str(tmp_path / "dev.txt"))
  assert ex.tags == ("B-ORG", "O", "B-MISC", "O")
  (ex,) = _predictor(tasks.get_task("conll2003", tag_scheme="iob1")).read(str(tmp_path / "dev.txt"))
  assert ex.tags == ("I-ORG", "O", "I-MISC", "O")


def test_labels_the_model_does_not_know_are_predicted_not_scored(tmp_path, capsys):
  """An input's label column with a label outside the model's set (or empty) is not an error: the
  examples are predicted, `score` gives None, and a warning names the labels."""
  from bert_jax.finetune import tasks  # pylint: disable=g-import-not-at-top
  task = tasks.get_task("csv", text_a="sentence").with_label_names(["neg", "pos"])
  (tmp_path / "known.csv").write_text("sentence,label\ngood,pos\nbad,neg\n")
  assert [e.label for e in _predictor(task).read(str(tmp_path / "known.csv"))] == ["pos", "neg"]
  (tmp_path / "new.csv").write_text("sentence,label\ngood,pos\nso so,neutral\nbad,\n")
  assert [e.label for e in _predictor(task).read(str(tmp_path / "new.csv"))] == [None, None, None]
  assert "'neutral'" in capsys.readouterr().err
  tagging = tasks.get_task("tagging").with_label_names(["O", "B-LOC", "I-LOC"])
  (tmp_path / "tags.conll").write_text("Paris B-CITY\nis O\n")
  (ex,) = _predictor(tagging).read(str(tmp_path / "tags.conll"))
  assert ex.tags is None and "'B-CITY'" in capsys.readouterr().err


def test_a_squad_v2_file_with_unanswerable_questions_is_scored(tmp_path):
  """An is_impossible question is labelled ("no answer"): a v2.0 file is scored as finetuning scores it,
  and a question with neither answers nor is_impossible leaves the file unscored."""
  from bert_jax.finetune import tasks  # pylint: disable=g-import-not-at-top
  context = "The Eiffel Tower is in Paris."
  qas = [{"id": "a", "question": "Where is the tower?", "answers": [{"text": "Paris", "answer_start": 22}]},
         {"id": "b", "question": "Where is the moon?", "answers": [], "is_impossible": True}]
  squad = {"version": "v2.0", "data": [{"title": "t", "paragraphs": [{"context": context, "qas": qas}]}]}
  (tmp_path / "dev.json").write_text(json.dumps(squad), encoding="utf-8")
  predictor = _predictor(tasks.get_task("squad_v2"))
  examples = predictor.read(str(tmp_path / "dev.json"))
  scores = predictor.score(examples, [{"answer": "Paris"}, {"answer": ""}])
  assert scores["exact_match"] == 1.0 and scores["NoAns_total"] == 1 and scores["HasAns_total"] == 1
  assert predictor.score(examples, [{"answer": "Paris"}, {"answer": "Paris"}])["exact_match"] == 0.5
  del qas[1]["is_impossible"]
  (tmp_path / "dev.json").write_text(json.dumps(squad), encoding="utf-8")
  assert predictor.score(predictor.read(str(tmp_path / "dev.json")), [{"answer": "Paris"}, {"answer": ""}]) is None


def test_quora_pairs_without_a_header_or_label_are_predicted_and_no_example_is_an_error(tmp_path):
  """A headerless file of two questions a row is unlabelled pairs; a file that leaves no example to predict is a
  DataError naming it and the format (not the argmax of an empty batch)."""
  from bert_jax.finetune import tasks  # pylint: disable=g-import-not-at-top
  predictor = _predictor(tasks.get_task("qqp"))
  (tmp_path / "q2.tsv").write_text("How do I root a phone?\tHow to root android?\n")
  (ex,) = predictor.read(str(tmp_path / "q2.tsv"))
  assert (ex.text_a, ex.text_b, ex.label) == ("How do I root a phone?", "How to root android?", None)
  (tmp_path / "q1.tsv").write_text("How do I root a phone?\n")
  with pytest.raises(readers.DataError, match=r"q1.tsv: no row has the headerless Quora fields is_duplicate, "
                     r"question1, question2\[, id\].*a header line naming the columns question1 and question2"):
    predictor.read(str(tmp_path / "q1.tsv"))
  # SNLI's examples without annotator consensus ("-") are skipped: here, every one.
  (tmp_path / "snli.jsonl").write_text(json.dumps({"sentence1": "a", "sentence2": "b", "gold_label": "-"}) + "\n")
  with pytest.raises(readers.DataError, match="snli.jsonl holds no example to predict"):
    _predictor(tasks.get_task("snli")).read(str(tmp_path / "snli.jsonl"))


def test_qa_input_columns_are_named_by_the_flags_the_message_names(tmp_path):
  """JSON lines with another context column: the message names predict's --context, and that flag reads it."""
  import types  # pylint: disable=g-import-not-at-top
  loaded = types.SimpleNamespace(config=None, params=None, tokenizer=None)
  record = {"task": "squad_v1", "task_opts": {}, "max_seq_length": 64}
  (tmp_path / "qa.jsonl").write_text(json.dumps({"question": "Where?", "text": "In Paris."}) + "\n")
  with pytest.raises(readers.DataError, match=r"no text column 'context' .* with --context=COLUMN\.$"):
    predict.Predictor.from_loaded(loaded, record).read(str(tmp_path / "qa.jsonl"))
  (ex,) = predict.Predictor.from_loaded(loaded, record, context="text").read(str(tmp_path / "qa.jsonl"))
  assert (ex.question_text, ex.doc_tokens) == ("Where?", ("In", "Paris."))
  with pytest.raises(failures.UserError, match="--text_a names a column of a sentence task's input.*--question"):
    predict.Predictor.from_loaded(loaded, record, text_a="text")
  run = subprocess.run([sys.executable, "-m", "bert_jax.cli", "predict", "--help"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
  assert "--context" in run.stdout and "--question" in run.stdout


def test_an_output_of_another_format_is_refused(tmp_path):
  assert [predict.output_format(p) for p in ("a.jsonl", "b.TSV", "c.csv", "/dev/stdout")] == [
      "jsonl", "tsv", "csv", "jsonl"]
  with pytest.raises(failures.UserError, match=r"p.xlsx: predict writes JSON lines \(.jsonl\), TSV"):
    predict.write(str(tmp_path / "p.xlsx"), [{"id": "0", "value": 1.0}])
  assert not (tmp_path / "p.xlsx").exists()


@pytest.mark.slow
def test_command_flags_out_of_range_and_unknown_formats_are_one_line_and_exit_2(tmp_path):
  cases = {("--output=p.jsonl", "--batch_size=0"): "bert-jax predict: flag --batch_size=0: 0 is not a positive integer",
           ("--output=p.xlsx",): "bert-jax predict: --output=p.xlsx: predict writes JSON lines (.jsonl), TSV (.tsv)"}
  assert_one_line_errors(["predict"], cases, tmp_path, common=("--checkpoint=nowhere", "--input=in.tsv"))
  assert not (tmp_path / "p.xlsx").exists()

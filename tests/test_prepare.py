"""`bert-jax prepare`: round trip, idempotent re-runs, bad-input counters, eval split, vocab training."""

import collections
import glob
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from bert_jax.data import corpus
from bert_jax.data import prepare
from bert_jax.data import sentencepiece_tokenizer
from bert_jax.data import shard_writing
from bert_jax.data import tokenizer as tokenization
from conftest import REPO_ROOT, shared_path
import test_corpus


def _records(pattern):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  documents = []
  for path in sorted(glob.glob(pattern)):
    for raw in tf.data.TFRecordDataset(path).as_numpy_iterator():
      feature = tf.train.Example.FromString(raw).features.feature
      documents.append((list(feature["token_ids"].int64_list.value),
                        list(feature["sentence_lengths"].int64_list.value)))
  return documents


def _expected(tok, documents):
  out = []
  for document in documents:
    ids = [tok.encode(s) for s in document]
    out.append(([i for x in ids for i in x], [len(x) for x in ids if x]))
  return out


@pytest.fixture
def small_corpus(tmp_path):
  """A JSON-lines corpus with every kind of bad input, and its documents as the reader sees them."""
  rows = [{"text": f"Document {i} talks about caf\u00e9s and r\u00e9sum\u00e9s. It has a second sentence! "
                   f"And a third one about {i * 7} items."} for i in range(60)]
  lines = [json.dumps(r).encode() for r in rows]
  lines[5:5] = [b"{broken", json.dumps({"title": "no text"}).encode(), json.dumps({"text": ""}).encode(),
                b'{"text": "Latin-1 caf\xe9 bytes. Still read."}',
                json.dumps({"text": "Only one sentence."}).encode(),
                json.dumps({"text": "\x00\x01\u200b\n" + "Z" * 30_000}).encode()]
  path = tmp_path / "in" / "corpus.jsonl"
  path.parent.mkdir()
  path.write_bytes(b"\n".join(lines) + b"\n")
  counters = collections.Counter()
  documents = list(corpus.read_documents(str(path), counters=counters))
  return str(path), documents, counters


@pytest.fixture(scope="module")
def vocab_file():
  return str(shared_path("minilm", "vocab.txt"))


def test_round_trip_counts_and_bad_input(tmp_path, small_corpus, vocab_file):
  spec, documents, counters = small_corpus
  out = str(tmp_path / "out")
  stats = prepare.prepare_corpus(spec, out, vocab_file=vocab_file, num_shards=3, num_workers=1)
  shards = [f"train-0000{k}-of-00003.tfrecord" for k in range(3)]
  assert sorted(os.listdir(out)) == [".prepare", "stats.json"] + shards + ["vocab.txt"]
  tok = tokenization.load_tokenizer(out)
  assert isinstance(tok, tokenization.WordPieceTokenizer) and tok.vocab_size == 30522
  expected = [e for e in _expected(tok, documents) if e[1]]  # the control-only document has no tokens
  assert _records(os.path.join(out, "train-*")) == expected
  assert stats["documents"] == len(expected) == 62
  assert stats["sentences"] == sum(len(e[1]) for e in expected)
  assert stats["tokens"] == sum(len(e[0]) for e in expected)
  assert sum(s["documents"] for s in stats["shards"].values()) == stats["documents"]
  # What the input pipeline checks each shard against when it reads it.
  sizes = {n: os.path.getsize(os.path.join(out, n)) for n in shards}
  assert {n: s["bytes"] for n, s in stats["shards"].items()} == sizes
  bad = stats["bad_input"]
  assert bad["bad_json_lines"] == 1 and bad["missing_text_field"] == 1 and bad["undecodable_lines"] == 1
  assert bad["long_lines"] == 1 and bad["empty_sentences"] == 1
  assert bad["empty_documents"] == 2  # "" and the document left with only control characters
  assert bad["single_sentence_documents"] == counters["single_sentence_documents"] == 2
  assert stats["tokenizer"] == "wordpiece" and stats["do_lower_case"] is True
  with open(os.path.join(out, "stats.json")) as f:
    assert json.load(f)["tokens"] == stats["tokens"]


def test_rerun_skips_finished_shards(tmp_path, small_corpus, vocab_file):
  spec, _, _ = small_corpus
  out = str(tmp_path / "out")
  first = prepare.prepare_corpus(spec, out, vocab_file=vocab_file, num_shards=3, num_workers=1)
  shards = sorted(glob.glob(os.path.join(out, "train-*")))
  mtimes = {p: os.stat(p).st_mtime_ns for p in shards}
  again = prepare.prepare_corpus(spec, out, vocab_file=vocab_file, num_shards=3, num_workers=1)
  assert {p: os.stat(p).st_mtime_ns for p in shards} == mtimes  # nothing rewritten
  os.remove(shards[1])
  with open(shards[1] + ".tmp-123", "wb") as f:
    f.write(b"partial shard of a killed run")
  third = prepare.prepare_corpus(spec, out, vocab_file=vocab_file, num_shards=3, num_workers=1)
  assert os.stat(shards[0]).st_mtime_ns == mtimes[shards[0]] and os.path.exists(shards[1])
  assert not glob.glob(os.path.join(out, "*.tmp-*"))
  # A shard whose record says it read another cut of the input (an older version's plan) is written again.
  progress = os.path.join(out, prepare._PROGRESS_DIR, "train-00002.json")
  with open(progress) as f:
    record = json.load(f)
  with open(progress, "w") as f:
    json.dump(dict(record, parts="another cut of the input"), f)
  fourth = prepare.prepare_corpus(spec, out, vocab_file=vocab_file, num_shards=3, num_workers=1)
  assert os.stat(shards[0]).st_mtime_ns == mtimes[shards[0]] and os.stat(shards[2]).st_mtime_ns != mtimes[shards[2]]
  for stats in (again, third, fourth):
    assert {k: stats[k] for k in ("documents", "sentences", "tokens", "shards", "bad_input")} == {
        k: first[k] for k in ("documents", "sentences", "tokens", "shards", "bad_input")}
  with pytest.raises(ValueError, match="other settings"):
    prepare.prepare_corpus(spec, out, vocab_file=vocab_file, num_shards=4, num_workers=1)


def test_eval_fraction_holds_out_fixed_documents(tmp_path, small_corpus, vocab_file):
  spec, _, _ = small_corpus
  runs = []
  for name in ("a", "b"):
    out = str(tmp_path / name)
    stats = prepare.prepare_corpus(spec, out, vocab_file=vocab_file, num_shards=2, num_workers=1,
                                   eval_fraction=0.25)
    runs.append((_records(os.path.join(out, "train-*")), _records(os.path.join(out, "eval-*"))))
    assert stats["splits"]["train"]["documents"] + stats["splits"]["eval"]["documents"] == 62
    assert 5 <= stats["splits"]["eval"]["documents"] <= 26
  assert runs[0] == runs[1]
  whole = str(tmp_path / "whole")
  prepare.prepare_corpus(spec, whole, vocab_file=vocab_file, num_shards=2, num_workers=1)
  assert sorted(runs[0][0] + runs[0][1]) == sorted(_records(os.path.join(whole, "train-*")))


def test_an_eval_input_beside_held_out_documents_keeps_both(tmp_path, small_corpus, vocab_file):
  """With one train shard, its held-out documents and the eval input's first shard had one name: one run
  overwrote the other's documents."""
  spec, _, _ = small_corpus
  (tmp_path / "eval.jsonl").write_text("".join(json.dumps({"text": f"Eval document {i}. It is held apart."}) + "\n"
                                               for i in range(7)))
  out = str(tmp_path / "out")
  held_out = prepare.prepare_corpus(spec, str(tmp_path / "held"), vocab_file=vocab_file, num_shards=1, num_workers=1,
                                    eval_fraction=0.25)["splits"]["eval"]["documents"]
  stats = prepare.prepare_corpus(spec, out, vocab_file=vocab_file, num_shards=1, num_workers=1, eval_fraction=0.25,
                                 eval_spec=str(tmp_path / "eval.jsonl"))
  assert stats["splits"]["eval"]["documents"] == held_out + 7 == len(_records(os.path.join(out, "eval-*")))
  # A directory prepared before the eval input's shards had their own name keeps its old shard: the reader
  # takes only the shards stats.json lists.
  from bert_jax.data import shards  # pylint: disable=g-import-not-at-top
  listed = shards.shard_files(out, "eval")
  shutil.copy(listed[-1], os.path.join(out, "eval-00000-of-00007.tfrecord"))
  assert shards.shard_files(out, "eval") == listed


@pytest.mark.parametrize("vocab_model", ["wordpiece", "unigram"])
def test_trains_a_vocabulary_when_none_is_given(tmp_path, vocab_model):
  out = str(tmp_path / "out")
  stats = prepare.prepare_corpus(corpus.SHAKESPEARE, out, train_vocab_size=400, vocab_model=vocab_model,
                                 vocab_sample_sentences=3000, num_shards=2, num_workers=1)
  tok = tokenization.load_tokenizer(out)
  expected_type = {"wordpiece": tokenization.WordPieceTokenizer,
                   "unigram": sentencepiece_tokenizer.SentencePieceTokenizer}[vocab_model]
  assert isinstance(tok, expected_type) and stats["vocab_size"] == tok.vocab_size <= 400
  assert stats["documents"] > 700 and stats["tokens"] > 500_000
  records = _records(os.path.join(out, "train-00000-*"))
  ids = np.concatenate([r[0] for r in records])
  assert ids.max() < tok.vocab_size and np.mean(ids == tok.unk_id) < 0.01
  assert not np.isin(ids, [tok.pad_id, tok.cls_id, tok.sep_id, tok.mask_id]).any()


@pytest.mark.slow
def test_cli_with_two_workers_on_news(tmp_path, vocab_file):
  """The real news corpus through `bert-jax prepare` with two spawned workers."""
  news = str(shared_path("corpora", "news_articles.jsonl"))
  out = str(tmp_path / "news")
  result = subprocess.run(
      [sys.executable, "-m", "bert_jax.cli", "prepare", f"--input={news}", f"--output_dir={out}",
       f"--vocab_file={vocab_file}", "--num_shards=4", "--num_workers=2"],
      capture_output=True, text=True, timeout=300, cwd=REPO_ROOT, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "[4/4 shards]" in result.stderr
  stats = json.loads(result.stdout.strip().splitlines()[-1])
  assert stats["documents"] == 3788 and stats["bad_input"]["bad_json_lines"] == 0
  assert 2_000_000 < stats["tokens"] < 3_500_000
  tok = tokenization.load_tokenizer(out)
  documents = list(corpus.read_documents(news))
  first = _records(os.path.join(out, "train-00000-*"))[:50]
  assert first == _expected(tok, documents[:50])
  serial = str(tmp_path / "serial")  # the same shards, byte for byte, without worker processes
  prepare.prepare_corpus(news, serial, vocab_file=vocab_file, num_shards=4, num_workers=1)
  for k in range(4):
    name = prepare.shard_name("train", k, 4)
    with open(os.path.join(out, name), "rb") as a, open(os.path.join(serial, name), "rb") as b:
      assert a.read() == b.read(), name


def test_tfds_input_with_explicit_data_dir(tmp_path, vocab_file):
  data_dir = str(tmp_path / "tfds")
  spec = test_corpus.prepare_tiny_tfds_dataset(data_dir)
  stats = prepare.prepare_corpus(spec, str(tmp_path / "out"), vocab_file=vocab_file, data_dir=data_dir,
                                 num_workers=1)
  assert stats["documents"] == 12 and stats["sentences"] == 24 and len(stats["shards"]) >= 1
  with pytest.raises(FileNotFoundError, match="not prepared"):
    prepare.prepare_corpus(spec, str(tmp_path / "out2"), vocab_file=vocab_file,
                           data_dir=str(tmp_path / "empty"), num_workers=1)


@pytest.mark.parametrize("family", ["roberta", "albert"])
def test_sentences_are_spelled_as_in_the_running_text(family):
  """A document's sentences are encoded one by one; byte-level BPE spells a sentence after the first with
  its space ("ĠThe", not "The"), as the running text, which finetuning and fill-mask encode."""
  tok = tokenization.load_tokenizer(shared_path("families", family))
  document = ["The market fell.", "The bank said it would act.", "Prices rose."]
  counters = collections.Counter()
  [(ids, lengths)] = list(shard_writing._encode_documents(  # pylint: disable=protected-access
      tok, [document], counters))
  assert ids.tolist() == tok.encode(" ".join(document)) and len(lengths) == 3 and lengths.sum() == len(ids)


def test_a_corpus_without_text_stops_before_a_vocabulary_or_shards_are_written(tmp_path):
  """An empty file, or JSON lines without the --text_key field: one error, not a vocabulary of the special
  tokens alone (which no worker can build a tokenizer from) or a prepared corpus of no documents."""
  (tmp_path / "empty.jsonl").write_text("")
  (tmp_path / "news.jsonl").write_text("".join(json.dumps({"body": f"Text {i}. More text."}) + "\n" for i in range(9)))
  for name in ("empty.jsonl", "news.jsonl"):
    out = tmp_path / f"out_{name}"
    with pytest.raises(ValueError, match=f"{name} holds no text: no JSON line with a string field 'text'"):
      prepare.prepare_corpus(str(tmp_path / name), str(out), train_vocab_size=400, num_shards=2, num_workers=1)
    assert not glob.glob(str(out / "*"))   # no vocabulary, no shards
  out = tmp_path / "with_vocab"
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("\n".join(list(tokenization.SPECIAL_TOKENS) + ["text", "more", "."]) + "\n")
  with pytest.raises(ValueError, match=r"news.jsonl holds no text: no JSON line with a string field 'text'"):
    prepare.prepare_corpus(str(tmp_path / "news.jsonl"), str(out), vocab_file=str(vocab), num_shards=1,
                           num_workers=1)
  assert not out.exists()   # nothing written: the same --output_dir takes the corrected command
  stats = prepare.prepare_corpus(str(tmp_path / "news.jsonl"), str(out), vocab_file=str(vocab), num_shards=1,
                                 num_workers=1, text_key="body")
  assert stats["documents"] == 9


def test_a_worker_that_cannot_start_fails_the_pool_instead_of_being_restarted_forever(tmp_path):
  (tmp_path / "vocab.txt").write_text("\n".join(tokenization.SPECIAL_TOKENS) + "\n")   # no tokenizer builds on it
  code = ("from bert_jax.data import prepare; prepare._run([{'name': f't{i}', 'parts': []} for i in range(2)], "
          f"{str(tmp_path)!r}, num_workers=2, do_lower_case=True)")
  # In a process of its own, with a time limit: before the fix this never returned.
  run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240, check=False)
  assert run.returncode == 1 and "RuntimeError: No valid vocab tokens" in run.stderr, run.stderr[-2000:]


def test_a_split_too_small_for_a_pretraining_format_is_said_when_it_is_prepared(tmp_path, vocab_file, caplog):
  """Pretraining refuses a host's split of one document in the nsp format at its start; prepare says so first."""
  assert prepare.few_documents({"train": {"documents": 2}, "eval": {"documents": 2}}) == []
  spec = tmp_path / "one.jsonl"
  spec.write_text(json.dumps({"text": "One document. It has two sentences."}) + "\n")
  with caplog.at_level("WARNING"):
    stats = prepare.prepare_corpus(str(spec), str(tmp_path / "out"), vocab_file=vocab_file, num_shards=1,
                                   num_workers=1, eval_fraction=0.5)
  assert stats["documents"] == 1
  said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
  held_out = stats["splits"]["eval"]["documents"]
  empty, one = ("train", "eval") if held_out else ("eval", "train")
  assert said == prepare.few_documents(stats["splits"]) and len(said) == 2, said
  assert any(w.startswith(f"the {empty} split holds no document") for w in said), said
  assert any(w.startswith(f"the {one} split holds 1 document: data.format 'nsp' and 'sentence_pair' need at least 2")
             for w in said), said


def test_a_refused_rerun_leaves_the_folder_s_vocabulary_and_a_swapped_one_is_named(tmp_path, small_corpus):
  """Another vocabulary for a prepared folder is refused before it is copied in (the shards hold the first one's
  ids); a vocabulary swapped in by hand is named when pretraining checks the data."""
  import ml_collections  # pylint: disable=import-outside-toplevel
  from bert_jax.data import input_pipeline  # pylint: disable=import-outside-toplevel
  spec, _, _ = small_corpus
  specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
  for name, words in (("a", ["document", "talks", "about"]), ("b", ["about", "talks", "document"])):
    (tmp_path / name).mkdir()
    (tmp_path / name / "vocab.txt").write_text("\n".join(specials + words) + "\n")
  out = tmp_path / "out"
  prepare.prepare_corpus(spec, str(out), vocab_file=str(tmp_path / "a" / "vocab.txt"), num_shards=1, num_workers=1)
  with pytest.raises(ValueError, match=r"other settings \(tokenizer_sha256: '[0-9a-f]{64}' there, '[0-9a-f]{64}' "
                     r"now\): use a new --output_dir"):
    prepare.prepare_corpus(spec, str(out), vocab_file=str(tmp_path / "b" / "vocab.txt"), num_shards=1, num_workers=1)
  assert (out / "vocab.txt").read_text() == (tmp_path / "a" / "vocab.txt").read_text()
  progress = out / prepare._PROGRESS_DIR  # pylint: disable=protected-access
  assert sorted(os.listdir(progress)) == ["settings.json", "train-00000.json"]
  data = ml_collections.ConfigDict({"train_files": str(out), "eval_files": "", "vocab_file": "", "do_lower_case": True})
  assert not input_pipeline.preparation_problems(data)
  (out / "vocab.txt").write_text((tmp_path / "b" / "vocab.txt").read_text())
  [problem] = input_pipeline.preparation_problems(data)
  assert problem.startswith(f"{out / 'vocab.txt'} is not the vocabulary {out}'s shards were prepared with")


def test_a_rerun_that_asks_for_another_trained_vocabulary_is_refused(tmp_path, small_corpus):
  spec, _, _ = small_corpus
  out = str(tmp_path / "out")
  prepare.prepare_corpus(spec, out, train_vocab_size=120, num_shards=1, num_workers=1)
  prepare.prepare_corpus(spec, out, train_vocab_size=120, num_shards=1, num_workers=1)   # the same: reused
  with pytest.raises(ValueError, match=r"trained_vocab: \{'model': 'wordpiece', 'size': 120\} there, "
                     r"\{'model': 'unigram', 'size': 120\} now"):
    prepare.prepare_corpus(spec, out, train_vocab_size=120, vocab_model="unigram", num_shards=1, num_workers=1)

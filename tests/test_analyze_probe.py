"""`bert-jax analyze probe`: probes find a planted layer, the SentEval-style builders give the labels they say,
word features sit on first word pieces, and the command writes its CSV, PNG and summary."""

import collections
import csv
import json
import os
import subprocess
import sys

import flax.linen as nn
import jax
import numpy as np
import pytest

from bert_jax.analysis import probe
from bert_jax.analysis import probe_fit
from bert_jax.analysis import senteval
from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.finetune import ner
from bert_jax.finetune import readers
from bert_jax.interop import checkpoints_hf
from bert_jax.models import encoder as model
from conftest import assert_one_line_errors

WORDS = ("the king queen walks talks sees a dog cat house garden river runs sleeps big small old new red blue "
         "green happy sad over under near far city town road").split()


def planted(rng, n, layers=4, width=16, signal_layer=2):
  """Features [layers, n, width] where only `signal_layer` carries the (3-class) label."""
  y = rng.integers(0, 3, n)
  x = rng.normal(size=(layers, n, width)).astype(np.float32)
  x[signal_layer, :, :3] += 6.0 * np.eye(3)[y]
  return x, [str(v) for v in y]


@pytest.mark.slow
def test_probes_and_scalar_mix_find_the_one_layer_that_carries_the_label():
  rng = np.random.default_rng(0)
  data = {split: planted(rng, n) for split, n in (("train", 600), ("dev", 200), ("test", 200))}
  r = probe_fit.probe_task({s: d[0] for s, d in data.items()}, {s: d[1] for s, d in data.items()})
  test = r["layers"]["test"]
  assert test[2] > 0.97, test
  assert max(test[[0, 1, 3]]) < 0.5, test  # chance is 1/3
  assert r["mix"]["test"] > 0.95
  assert int(np.argmax(r["mix_weights"])) == 2 and abs(r["expected_layer"] - 2) < 0.35, r["mix_weights"]
  assert 0.2 < r["majority_baseline"] < 0.45 and r["num_classes"] == 3


def corpus(rng, n=400):
  """Sentences of 5..28 tokens from WORDS, each ending in a full stop."""
  return [tuple(rng.choice(WORDS, size=rng.integers(4, 28)).tolist()) + (".",) for _ in range(n)]


def test_read_sentences_splits_tokenizes_keeps_5_to_28_tokens_once(tmp_path):
  text = ("The king walks. The queen, old and happy, sees a dog near the river! The cat sees the dog. "
          + "A long one " * 10 + "ends here. The cat sees the dog.")
  path = tmp_path / "c.jsonl"
  path.write_text(json.dumps({"text": text}) + "\n\n" + json.dumps({"text": "Dr. Who's cat sleeps in town."}) + "\n")
  # Out: "The king walks." (4 tokens), the 33-token one, the repeat, "Dr." (split before a capital).
  assert senteval.read_sentences(str(path)) == [
      ("The", "queen", ",", "old", "and", "happy", ",", "sees", "a", "dog", "near", "the", "river", "!"),
      ("The", "cat", "sees", "the", "dog", "."), ("Who's", "cat", "sleeps", "in", "town", ".")]


def test_sentlen_bins_and_balanced_labels():
  assert [senteval.sentlen_bin(n) for n in (5, 8, 9, 12, 13, 24, 25, 28)] == [
      "5-8", "5-8", "9-12", "9-12", "13-16", "21-24", "25-28", "25-28"]
  with pytest.raises(ValueError):
    senteval.sentlen_bin(29)
  rng = np.random.default_rng(1)
  pairs = senteval.build_sentlen(corpus(rng), 120, rng)
  counts = collections.Counter(label for _, label in pairs)
  assert len(counts) == 6 and set(counts.values()) == {20}
  for text, label in pairs:
    lo, hi = map(int, label.split("-"))
    assert lo <= len(text.split()) <= hi


def test_wc_sentences_hold_exactly_one_target_word_their_label():
  rng = np.random.default_rng(2)
  sentences = corpus(rng, 600)
  pairs = senteval.build_wc(sentences, 60, rng, num_words=4, ranks=(3, 20))
  targets = {label for _, label in pairs}
  counts = collections.Counter(label for _, label in pairs)
  assert len(targets) == 4 and len(set(counts.values())) == 1
  for text, label in pairs:
    found = [w for w in text.lower().split() if w in targets]
    assert found == [label]


def test_bshift_inverts_two_adjacent_different_words_in_half():
  rng = np.random.default_rng(3)
  sentences = corpus(rng)
  originals = {" ".join(s) for s in sentences}
  pairs = senteval.build_bshift(sentences, 101, rng)
  assert collections.Counter(label for _, label in pairs) == {"O": 50, "I": 50}
  for text, label in pairs:
    if label == "O":
      assert text in originals
      continue
    tokens = text.split()
    swaps = [i for i in range(len(tokens) - 1)
             if " ".join(tokens[:i] + [tokens[i + 1], tokens[i]] + tokens[i + 2:]) in originals]
    assert swaps and text not in originals and tokens[swaps[0]] != tokens[swaps[0] + 1]


def test_build_splits_per_class_disjoint_and_seeded():
  rng = np.random.default_rng(4)
  sentences = corpus(rng)
  splits = senteval.build("bshift", sentences, 200, seed=7)
  assert {k: len(v) for k, v in splits.items()} == {"train": 160, "dev": 20, "test": 20}
  for part in splits.values():
    assert collections.Counter(e.label for e in part) == {"O": len(part) // 2, "I": len(part) // 2}
  texts = [{e.text_a for e in part} for part in splits.values()]
  assert not (texts[0] & texts[1] or texts[0] & texts[2] or texts[1] & texts[2])
  assert senteval.build("bshift", sentences, 200, seed=7) == splits


def tiny_checkpoint(directory):
  """A random 2-layer BERT as a Hugging Face directory, with a WordPiece vocabulary of WORDS (+ `##s`)."""
  vocab = list(tokenizer_lib.SPECIAL_TOKENS) + [".", ",", "##s"] + list(WORDS)
  os.makedirs(directory, exist_ok=True)
  vocab_file = os.path.join(directory, "vocab.txt")
  with open(vocab_file, "w") as f:
    f.write("\n".join(vocab) + "\n")
  cfg = model.BertConfig(vocab_size=len(vocab), hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32,
                         max_position_embeddings=64)
  ids = np.zeros([1, 8], np.int32)
  params = nn.unbox(jax.jit(model.BertEncoder(cfg).init)(jax.random.key(0), ids))["params"]
  checkpoints_hf.save_hf(directory, cfg, {"bert": params})
  return cfg, params, tokenizer_lib.load_tokenizer(vocab_file)


@pytest.mark.slow
def test_token_features_are_the_first_word_piece_of_each_word(tmp_path):
  cfg, params, tok = tiny_checkpoint(str(tmp_path / "ckpt"))
  examples = [ner.NerExample("0", ("kings", "walk", "dogs", "."), ("N", "V", "N", ".")),
              ner.NerExample("1", ("the", "queens", "sees", "rivers", "far"), ("D", "N", "V", "N", "A"))]
  inputs, labels = probe.token_inputs(tok, examples, max_length=8)  # the second sentence loses "far"
  assert labels == ["N", "V", "N", ".", "D", "N", "V", "N"]
  ids = [tok.convert_ids_to_tokens(i) for i, _ in inputs]
  assert ids[0] == ["[CLS]", "king", "##s", "[UNK]", "dog", "##s", ".", "[SEP]"]  # "walk" is not in the vocabulary
  assert [np.flatnonzero(r).tolist() for r in inputs[0][1]] == [[1], [3], [4], [6]]
  assert [np.flatnonzero(r).tolist() for r in inputs[1][1]] == [[1], [2], [4], [5]]
  features = probe.encode(cfg, params, inputs, batch_size=4)
  assert features.shape == (3, 8, 16)
  apply = jax.jit(lambda p, ids: model.BertEncoder(cfg).apply({"params": p}, ids, output_hidden_states=True))
  hidden = np.asarray(apply(params, inputs[0][0][None])["hidden_states"])  # unpadded, alone
  np.testing.assert_allclose(features[:, :4], hidden[:, 0, [1, 3, 4, 6]], atol=1e-5)


@pytest.mark.slow
def test_command_writes_csv_png_and_summary(tmp_path):
  tiny_checkpoint(str(tmp_path / "ckpt"))
  rng = np.random.default_rng(5)
  (tmp_path / "corpus.txt").write_text("\n".join(" ".join(s) for s in corpus(rng, 300)) + "\n")
  conll = "\n\n".join("\n".join(f"{w} {'N' if w in ('dog', 'cat', 'king') else 'O'}" for w in s)
                      for s in corpus(rng, 30))
  (tmp_path / "tags.txt").write_text(conll + "\n")
  argv = [sys.executable, "-m", "bert_jax.cli", "analyze", "probe", "--checkpoint=ckpt",   # as typed
          f"--task=sentlen,conll:{tmp_path / 'tags.txt'}", f"--corpus={tmp_path / 'corpus.txt'}",
          f"--output_dir={tmp_path / 'out'}", "--max_examples=120", "--max_epochs=5", "--probe=mlp",
          "--hidden_size=8"]
  run = subprocess.run(argv, cwd=tmp_path, env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True,
                       text=True, timeout=300)
  assert run.returncode == 0, run.stderr[-3000:]
  with open(tmp_path / "out" / "probe.csv") as f:
    rows = list(csv.DictReader(f))
  assert [(r["task"], r["layer"]) for r in rows] == [
      (t, l) for t in ("sentlen", "conll:tags") for l in ("0", "1", "2", "mix")]
  assert all(0 <= float(r["test_accuracy"]) <= 1 for r in rows)
  assert float(rows[0]["majority_baseline"]) < 0.34  # six balanced bins
  summary = json.loads((tmp_path / "out" / "summary.json").read_text())
  assert set(summary["tasks"]) == {"sentlen", "conll:tags"} and summary["checkpoint"] == str(tmp_path / "ckpt")
  assert 0 <= summary["tasks"]["conll:tags"]["expected_layer"] <= 2
  assert summary["tasks"]["conll:tags"]["num_classes"] == 2
  assert summary["tasks"]["sentlen"]["examples"] == {"train": 96, "dev": 12, "test": 12}
  assert (tmp_path / "out" / "probe.png").stat().st_size > 10_000
  assert set(json.loads(run.stdout)) == {"sentlen", "conll:tags"}   # stdout is the results alone
  assert "sentlen: test accuracy per layer" in run.stderr   # progress, on stderr


def test_tsv_and_conll_sources_split_what_they_lack(tmp_path):
  (tmp_path / "sst").mkdir()
  for split, n in (("train", 50), ("dev", 7)):
    rows = "".join(f"{split} film {i}\t{i % 2}\n" for i in range(n))
    (tmp_path / "sst" / f"{split}.tsv").write_text("sentence\tlabel\n" + rows)
  task = probe.load_task(f"tsv:{tmp_path / 'sst'}", 40, 0, opts={"text_column": "sentence", "label_column": "label"})
  assert task["name"] == "tsv:sst" and task["kind"] == "sentence"
  sizes = {s: len(v) for s, v in task["splits"].items()}
  assert sizes == {"train": 32, "dev": 4, "test": 4}  # test carved out of train; dev from dev.tsv
  assert all(e.text_a.startswith("dev") for e in task["splits"]["dev"])
  assert all(e.text_a.startswith("train") for s in ("train", "test") for e in task["splits"][s])
  (tmp_path / "tags.txt").write_text("\n\n".join(f"w{i} X N\nv{i} Y V" for i in range(20)) + "\n")
  task = probe.load_task(f"conll:{tmp_path / 'tags.txt'}", 100, 0, opts={"tag_column": 1})
  assert task["kind"] == "token"
  assert {s: len(v) for s, v in task["splits"].items()} == {"train": 16, "dev": 2, "test": 2}
  assert task["splits"]["train"][0].tags == ("X", "Y")
  (tmp_path / "two.txt").write_text("a X\n\nb Y\n")
  with pytest.raises(ValueError, match="too few examples"):
    probe.load_task(f"conll:{tmp_path / 'two.txt'}", 100, 0, opts={"tag_column": -1})
  # A tag column the file lacks names the probe's own flag.
  with pytest.raises(readers.DataError, match=r"column 5; set --tag_column\)"):
    probe.load_task(f"conll:{tmp_path / 'tags.txt'}", 100, 0, opts={"tag_column": 5})


def test_inputs_longer_than_the_position_table_are_cut_to_it(tmp_path):
  """`--max_length` above the positions the model holds (64 here) cuts sentences and tagged words to them."""
  cfg, params, tok = tiny_checkpoint(str(tmp_path / "ckpt"))
  words = tuple(WORDS[i % len(WORDS)] for i in range(100))
  sentence = [readers.PairExample(guid="0", text_a=" ".join(words), label="1")]
  inputs, _ = probe.task_inputs(cfg, tok, "sentence", sentence, 128)
  assert len(inputs[0][0]) == 64
  assert probe.encode(cfg, params, inputs, batch_size=2).shape == (3, 1, 16)
  inputs, labels = probe.task_inputs(cfg, tok, "token", [ner.NerExample("0", words, ("N",) * 100)], 128)
  assert len(inputs[0][0]) == 64 and len(labels) == 62


def test_a_corpus_line_without_its_text_field_is_named(tmp_path):
  """Not "the corpus has no sentence for this task": the field is missing, and --text_key names another."""
  (tmp_path / "notext.jsonl").write_text('{"body": "The king rides north to the sea."}\n{"title": "a"}\n')
  with pytest.raises(readers.DataError, match=r"notext.jsonl, line 1: no 'text' field \(its fields: body\)\. "
                     r"Name the field that holds the text with --text_key=FIELD"):
    senteval.read_sentences(str(tmp_path / "notext.jsonl"))
  with pytest.raises(readers.DataError, match=r"notext.jsonl, line 2: no 'body' field \(its fields: title\)"):
    senteval.read_sentences(str(tmp_path / "notext.jsonl"), "body")


@pytest.mark.slow
def test_command_mistakes_are_one_line_and_exit_2(tmp_path):
  """A flag out of its range, an --output_dir that is a file: one line, exit 2, before any work."""
  (tmp_path / "README.md").write_text("a file\n")
  (tmp_path / "corpus.txt").write_text("The king rides north to the sea.\n")
  cases = {("--learning_rate=0",): "bert-jax analyze probe: flag --learning_rate=0.0: --learning_rate must be above 0",
           ("--max_epochs=0",): "bert-jax analyze probe: flag --max_epochs=0: 0 is not a positive integer",
           ("--output_dir=README.md",):
               f"bert-jax analyze probe: cannot write {tmp_path}/README.md/summary.json: its folder cannot be made"}
  assert_one_line_errors(["analyze", "probe"], cases, tmp_path,
                         common=("--checkpoint=nowhere", "--task=sentlen", "--corpus=corpus.txt", "--output_dir=out"))


def test_a_tsv_source_without_its_columns_names_the_probe_flags(tmp_path):
  (tmp_path / "train.tsv").write_text("text\tlabel\na film\t1\n")
  with pytest.raises(readers.DataError, match=r"no text column 'sentence' .* with --text_column=COLUMN\.$"):
    probe.load_task(f"tsv:{tmp_path / 'train.tsv'}", 40, 0, opts={"text_column": "sentence", "label_column": "label"})
  with pytest.raises(readers.DataError, match=r"no label column 'y' .* with --label_column=COLUMN\.$"):
    probe.load_task(f"tsv:{tmp_path / 'train.tsv'}", 40, 0, opts={"text_column": "text", "label_column": "y"})

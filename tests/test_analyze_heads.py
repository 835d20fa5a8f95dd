"""`bert-jax analyze heads`: the statistics on planted attention with known answers, the corpus reading, and the
command end to end on a tiny random checkpoint."""

import csv
import json
import os
import subprocess
import sys

import flax.linen as nn
import jax
import numpy as np
import pytest

from bert_jax.analysis import heads
from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.interop import checkpoints_hf
from bert_jax.models import encoder as model
from conftest import assert_one_line_errors

WORDS = ["the", "king", "keeps", "a", "crown", "queen", "rides", "north", ".", ","]


def planted(lengths=(6, 4), width=6):
  """Attention [1 layer, B, 6 heads, L, L] with padding, and its mask and kinds ([SEP] last, rarest at 2).

  Heads: 0 the previous token (the first query itself), 1 uniform over the real keys, 2 all on [SEP], 3 the next
  token (the last query itself), 4 all on the rarest token, 5 a pruned head (zeros). Padded query rows hold
  garbage (all on key 0): it must not count.
  """
  a = np.zeros((1, len(lengths), 6, width, width), np.float32)
  mask = np.zeros((len(lengths), width), np.int32)
  kinds = {k: np.zeros((len(lengths), width), bool) for k in ("cls", "sep", "punct", "rarest", "rare_valid")}
  for b, n in enumerate(lengths):
    mask[b, :n] = 1
    kinds["cls"][b, 0] = kinds["sep"][b, n - 1] = kinds["rarest"][b, 2] = True
    kinds["rare_valid"][b, :n] = True
    a[0, b, :, n:, 0] = 1.0
    for q in range(n):
      a[0, b, 0, q, max(q - 1, 0)] = 1.0
      a[0, b, 1, q, :n] = 1.0 / n
      a[0, b, 2, q, n - 1] = 1.0
      a[0, b, 3, q, min(q + 1, n - 1)] = 1.0
      a[0, b, 4, q, 2] = 1.0
  return a, mask, kinds


def test_planted_heads_have_their_known_statistics_and_labels():
  a, mask, kinds = planted()
  sums = jax.device_get(heads.batch_sums(a, mask, kinds))
  stats = {k: v[0] for k, v in heads.finish(sums).items()}   # layer 0: [6 heads]
  assert sums["queries"] == 10 and sums["examples"] == 2 and sums["prev_cases"] == 8
  np.testing.assert_allclose(stats["argmax_prev"][[0, 3]], [1.0, 0.0])
  np.testing.assert_allclose(stats["argmax_next"][[0, 3]], [0.0, 1.0])
  np.testing.assert_allclose(stats["attn_prev"][0], 8 / 10)     # the two first queries attend to themselves
  # Uniform: entropy log(n) per query, confidence 1/n; the average attention of an input is uniform too.
  np.testing.assert_allclose(stats["entropy"][1], (6 * np.log(6) + 4 * np.log(4)) / 10, rtol=1e-6)
  np.testing.assert_allclose(stats["entropy_of_mean"][1], (np.log(6) + np.log(4)) / 2, rtol=1e-6)
  np.testing.assert_allclose(stats["entropy_cls"][1], (np.log(6) + np.log(4)) / 2, rtol=1e-6)
  np.testing.assert_allclose(stats["confidence"][1], (6 / 6 + 4 / 4) / 10, rtol=1e-6)
  np.testing.assert_allclose(stats["attn_sep"][[1, 2]], [2 / 10, 1.0], rtol=1e-6)
  np.testing.assert_allclose(stats["attn_cls"][1], 2 / 10, rtol=1e-6)
  np.testing.assert_allclose(stats["entropy"][2], 0.0, atol=1e-7)
  np.testing.assert_allclose(stats["confidence"][2], 1.0)
  np.testing.assert_allclose(stats["argmax_rare"][[2, 4]], [0.0, 1.0])
  np.testing.assert_allclose(stats["argmax_prev"][5] + stats["argmax_rare"][5] + stats["confidence"][5], 0.0)
  np.testing.assert_allclose(sums["rare_chance"] / sums["rare_cases"], (6 / 6 + 4 / 4) / 10, rtol=1e-6)
  np.testing.assert_allclose(sums["uniform_entropy"] / sums["queries"], (6 * np.log(6) + 4 * np.log(4)) / 10,
                             rtol=1e-6)
  labels = heads.labels({k: v[None] for k, v in stats.items()})
  assert labels["positional"][0].tolist() == [-1, 0, 0, 1, 0, 0]
  assert labels["rare_token"][0].tolist() == [False, False, False, False, True, False]


def test_sums_of_batches_give_the_statistic_of_the_whole_not_a_mean_of_means():
  a, mask, kinds = planted(lengths=(6, 2))
  halves = [heads.batch_sums(a[:, i:i + 1], mask[i:i + 1], {k: v[i:i + 1] for k, v in kinds.items()})
            for i in (0, 1)]
  joined = heads.finish(jax.tree.map(lambda x, y: np.asarray(x) + np.asarray(y), *halves))
  whole = heads.finish(jax.device_get(heads.batch_sums(a, mask, kinds)))
  for name in heads.STATS:
    np.testing.assert_allclose(joined[name], whole[name], rtol=1e-6, err_msg=name)
  # [SEP] share of the uniform head: 2 of 8 queries' weight, not the mean of 1/6 and 1/2.
  np.testing.assert_allclose(whole["attn_sep"][0, 1], (6 * 1 / 6 + 2 * 1 / 2) / 8, rtol=1e-6)


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory):
  path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
  path.write_text("\n".join(list(tokenizer_lib.SPECIAL_TOKENS) + WORDS) + "\n")
  return path


def test_documents_sentences_and_inputs(vocab_file):
  tok = tokenizer_lib.load_tokenizer(str(vocab_file))
  text = "The king keeps a crown. The queen rides north, the king rides. A crown."
  assert heads.split_sentences(text) == ["The king keeps a crown.", "The queen rides north, the king rides.",
                                         "A crown."]
  assert heads.read_documents(['{"body": "a b"}\n', "\n", '{"body": "c"}\n'], "body") == ["a b", "c"]
  assert heads.read_documents(["a b\n", "c\n", "\n", "d\n"]) == ["a b\nc", "d"]
  pairs = heads.make_inputs([text], tok, max_length=18)
  assert [tok.convert_ids_to_tokens(e.input_ids) for e in pairs] == [
      "[CLS] the king keeps a crown . [SEP] the queen rides north , the king rides . [SEP]".split(),
      "[CLS] a crown . [SEP]".split()]
  assert pairs[0].token_type_ids.tolist() == [0] * 8 + [1] * 10
  # Too long for half the budget: A takes a whole sentence, B what fits, then longest-first truncation.
  assert tok.convert_ids_to_tokens(heads.make_inputs([text], tok, max_length=12)[0].input_ids) == (
      "[CLS] the king keeps a crown [SEP] the queen rides north [SEP]".split())
  ones = heads.make_inputs([text, text], tok, max_length=6, sentences=True, max_examples=4)
  assert [len(e.input_ids) for e in ones] == [6, 6, 5, 6]


def test_key_kinds_mark_specials_punctuation_and_the_rarest_token(vocab_file):
  tok = tokenizer_lib.load_tokenizer(str(vocab_file))
  examples = [heads.embed.Example(*map(np.asarray, tok.encode_pair(t)))
              for t in ("The king keeps the crown.", "The king, the crown.", "A queen")]
  assert heads.punctuation_ids(tok) == sorted(tok.convert_tokens_to_ids([".", ","]))
  kinds = heads.key_kinds(tok, examples, common=2)
  # "keeps" and "," occur once in the corpus; "a" and "queen" tie, so the third input does not count.
  assert kinds[0]["rarest"].tolist() == [False, False, False, True, False, False, False, False]
  assert kinds[1]["rarest"].tolist() == [False, False, False, True, False, False, False, False]
  assert [k["rare_valid"].all() for k in kinds] == [True, True, False]
  assert kinds[0]["cls"][0] and kinds[0]["sep"][-1] and kinds[0]["punct"].tolist() == [0] * 6 + [1, 0]
  # A rarest token among the corpus's most frequent does not count either (Voita et al.'s filter).
  assert not any(k["rare_valid"].any() for k in heads.key_kinds(tok, examples, common=len(WORDS)))


@pytest.mark.slow
def test_command_writes_csv_heat_maps_and_summary(vocab_file, tmp_path):
  cfg = model.BertConfig.from_preset("tiny", vocab_size=len(tokenizer_lib.SPECIAL_TOKENS) + len(WORDS),
                                     max_position_embeddings=32)
  ids = np.ones((1, 4), np.int32)
  params = jax.tree.map(np.asarray, nn.unbox(jax.jit(model.BertEncoder(cfg).init)(jax.random.key(0), ids)["params"]))
  checkpoints_hf.save_hf(tmp_path / "ckpt", cfg, {"bert": params}, vocab_file=vocab_file)
  sentences = ["The king keeps a crown.", "The queen rides north, the king rides.", "A crown, the crown."]
  docs = [" ".join(sentences[i:] + sentences[:i]) for i in range(3)]
  (tmp_path / "in.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  argv = [sys.executable, "-m", "bert_jax.cli", "analyze", "heads", "--checkpoint=ckpt", "--input=in.jsonl",
          "--output_dir=out", "--max_length=12", "--batch_size=2", "--max_examples=5"]   # paths as typed
  result = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  with open(tmp_path / "out" / "heads.csv") as f:
    rows = list(csv.DictReader(f))
  assert len(rows) == cfg.num_layers * cfg.num_heads
  assert {"layer", "head", *heads.STATS, "positional", "rare_token"} == set(rows[0])
  for row in rows:   # a random model attends almost uniformly over at most 12 tokens
    assert 0 < float(row["entropy"]) <= np.log(12) + 1e-4
    assert 0 < float(row["confidence"]) <= 1
  summary = json.loads((tmp_path / "out" / "summary.json").read_text())
  assert summary["inputs"] == 5 and summary["layout"] == "pairs"
  # Recorded absolute: the summary read from elsewhere still names the checkpoint and input it measured.
  assert (summary["checkpoint"], summary["input"]) == (str(tmp_path / "ckpt"), str(tmp_path / "in.jsonl"))
  assert len(summary["sep_over_half_per_layer"]) == cfg.num_layers
  for name in heads.STATS:
    assert (tmp_path / "out" / f"heads_{name}.png").stat().st_size > 1000


def test_heads_removed_by_pruning_have_no_statistics():
  """A pruned checkpoint's removed heads attend nowhere: NaN (not an entropy of 0, a perfectly focused head's),
  and the per-layer shares count the heads the layer has."""
  from bert_jax.models import pruning  # pylint: disable=g-import-not-at-top
  from bert_jax.tools import embed  # pylint: disable=g-import-not-at-top
  cfg = model.BertConfig(vocab_size=20, hidden_size=16, num_layers=2, num_heads=4, intermediate_size=32,
                         max_position_embeddings=16, hidden_dropout=0.0, attention_dropout=0.0)
  shapes = jax.eval_shape(model.BertEncoder(cfg).init, jax.random.key(0), np.ones((1, 4), np.int32))["params"]
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda s: rng.normal(0.0, 0.3, s.shape).astype(np.float32), nn.unbox(shapes))
  cfg, params = pruning.prune_heads(cfg, params, {1: [0, 1, 2]})
  examples = [embed.Example(np.array([2, 7, 8, 9, 3], np.int32), np.zeros(5, np.int32))]
  kinds = [{k: np.zeros(5, bool) for k in ("cls", "sep", "punct", "rarest", "rare_valid")}]
  kinds[0]["cls"][0] = kinds[0]["sep"][4] = True
  stats, sums = heads.head_statistics(cfg, params, examples, kinds)
  assert np.isnan(stats["entropy"][1, :3]).all() and np.isnan(stats["attn_sep"][1, :3]).all()
  assert not np.isnan(stats["entropy"][0]).any() and not np.isnan(stats["entropy"][1, 3])
  share = heads.summarize(stats, heads.labels(stats), sums)["sep_over_half_per_layer"]
  assert share[1] in (0.0, 1.0)   # of its one head, not of four


def test_a_json_line_without_its_text_names_the_file_the_line_and_the_flag():
  with pytest.raises(heads.readers.DataError, match=r"^news.jsonl, line 2: no 'body' field \(its fields: id, "
                     r"title\)\. Name the field that holds the text with --text_key=FIELD\.$"):
    heads.read_documents(['{"body": "a"}\n', '{"title": "b", "id": 1}\n'], "body", path="news.jsonl")
  with pytest.raises(heads.readers.DataError, match="news.jsonl, line 3: not JSON"):
    heads.read_documents(['{"body": "a"}\n', "\n", "{body}\n"], "body", path="news.jsonl")


@pytest.mark.slow
def test_command_mistakes_are_one_line_and_exit_2(tmp_path):
  """A missing --text_key field, a flag out of its range, an --output_dir that is a file: no traceback."""
  (tmp_path / "README.md").write_text("a file\n")
  (tmp_path / "news.jsonl").write_text('{"title": "a"}\n')
  cases = {("--checkpoint=nowhere", "--input=news.jsonl", "--output_dir=out", "--batch_size=0"):
               "bert-jax analyze heads: flag --batch_size=0: 0 is not a positive integer",
           ("--checkpoint=nowhere", "--input=news.jsonl", "--output_dir=README.md"):
               f"bert-jax analyze heads: cannot write {tmp_path}/README.md/summary.json: its folder cannot be made"}
  assert_one_line_errors(["analyze", "heads"], cases, tmp_path)

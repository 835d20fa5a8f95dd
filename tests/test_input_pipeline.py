"""The pipeline on real prepared shards: batch format, masking and pairing statistics, packing,
resume in a fresh process, host sharding, eval.

The corpus is the first 300 news articles, tokenized once for the module with the MiniLM vocab.
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from bert_jax import failures
from bert_jax.data import input_pipeline
from bert_jax.data import shards
from bert_jax.data import masking
from bert_jax.data import prepare
from bert_jax.data import tokenizer
from configs import common
from conftest import REPO_ROOT, shared_path

ARTICLES = 300


@pytest.fixture(scope="module")
def news_dir(tmp_path_factory):
  corpus = shared_path("corpora", "news_articles.jsonl")
  vocab = shared_path("minilm", "vocab.txt")
  root = tmp_path_factory.mktemp("news")
  with open(corpus) as src, open(root / "news.jsonl", "w") as dst:
    for _, line in zip(range(ARTICLES), src):
      dst.write(line)
  out = str(root / "prepared")
  prepare.prepare_corpus(str(root / "news.jsonl"), out, vocab_file=str(vocab), num_shards=2, num_workers=1)
  return out


@pytest.fixture(scope="module")
def tok(news_dir):
  return tokenizer.load_tokenizer(news_dir)


def _config(news_dir, **overrides):
  c = common.data_config()
  c.train_files = news_dir
  c.eval_fraction = 0.05
  for k, v in overrides.items():
    setattr(c, k, v)
  return c


def _iterator(news_dir, global_batch_size=64, process_index=0, process_count=1, **overrides):
  return input_pipeline.create_pretrain_iterator(
      _config(news_dir, **overrides), global_batch_size=global_batch_size,
      process_index=process_index, process_count=process_count)


def _originals(batch):
  """input_ids with the masked positions put back."""
  ids = batch["input_ids"].copy()
  rows, slots = np.nonzero(batch["masked_lm_weights"])
  ids[rows, batch["masked_lm_positions"][rows, slots]] = batch["masked_lm_ids"][rows, slots]
  return ids


def test_batch_format(news_dir, tok):
  batch = next(_iterator(news_dir))
  expected = {"input_ids": (np.int32, (64, 128)), "input_mask": (np.int32, (64, 128)),
              "segment_ids": (np.int32, (64, 128)), "masked_lm_positions": (np.int32, (64, 20)),
              "masked_lm_ids": (np.int32, (64, 20)), "masked_lm_weights": (np.float32, (64, 20)),
              "next_sentence_labels": (np.int32, (64,))}
  assert {k: (v.dtype, v.shape) for k, v in batch.items()} == expected
  ids = _originals(batch)
  assert (ids[:, 0] == tok.cls_id).all()
  assert ((ids == tok.sep_id).sum(1) == 2).all()
  assert ((ids == tok.pad_id) == (batch["input_mask"] == 0)).all()
  length = batch["input_mask"].sum(1)
  assert (ids[np.arange(64), length - 1] == tok.sep_id).all()
  # Segment B runs from after the first [SEP] to the last one.
  first_sep = np.argmax(ids == tok.sep_id, 1)
  j = np.arange(128)[None, :]
  np.testing.assert_array_equal(batch["segment_ids"], (j > first_sep[:, None]) & (j < length[:, None]))


def _masking_sample(news_dir, tok, batches=12, **overrides):
  it = _iterator(news_dir, **overrides)
  out = [next(it) for _ in range(batches)]
  special = np.zeros(tok.vocab_size, bool)
  special[tok.special_ids] = True
  return out, special


def test_masking_statistics(news_dir, tok):
  batches, special = _masking_sample(news_dir, tok)
  masked = maskable = 0
  kinds = np.zeros(3)
  for batch in batches:
    ids, weights = _originals(batch), batch["masked_lm_weights"]
    maskable += ((batch["input_mask"] == 1) & ~special[ids]).sum()
    masked += weights.sum()
    rows, slots = np.nonzero(weights)
    position = batch["masked_lm_positions"][rows, slots]
    never = np.isin(batch["masked_lm_ids"][rows, slots], [tok.cls_id, tok.sep_id, tok.pad_id])
    assert not never.any()  # [UNK] may be masked (as google-research/bert), [CLS]/[SEP]/[PAD] never
    assert (batch["input_mask"][rows, position] == 1).all()
    now = batch["input_ids"][rows, position]
    is_mask, kept = now == tok.mask_id, now == batch["masked_lm_ids"][rows, slots]
    kinds += [is_mask.sum(), kept.sum(), (~is_mask & ~kept).sum()]
  assert masked > 10_000
  assert abs(masked / maskable - 0.15) < 0.01
  np.testing.assert_allclose(kinds / kinds.sum(), [0.8, 0.1, 0.1], atol=0.02)


@pytest.mark.parametrize("scheme", ["whole_word_masking", "span_masking"])
def test_word_schemes_never_split_a_word(news_dir, tok, scheme):
  batches, special = _masking_sample(news_dir, tok, batches=4, **{scheme: True})
  starts_word = tok.word_start_table()
  masked = maskable = 0
  for batch in batches:
    ids = _originals(batch)
    is_masked = np.zeros(ids.shape, bool)
    rows, slots = np.nonzero(batch["masked_lm_weights"])
    is_masked[rows, batch["masked_lm_positions"][rows, slots]] = True
    masked, maskable = masked + is_masked.sum(), maskable + ((batch["input_mask"] == 1) & ~special[ids]).sum()
    # A continuation piece is masked exactly when the piece before it is.
    continuation = ~starts_word[ids[:, 1:]] & ~special[ids[:, 1:]] & ~special[ids[:, :-1]]
    assert continuation.sum() > 100
    np.testing.assert_array_equal(is_masked[:, 1:][continuation], is_masked[:, :-1][continuation])
  assert 0.13 < masked / maskable < 0.16  # the budget, less what a whole word could not fit


def test_pairs_labels_and_short_sequences(news_dir, tok):
  maker = _iterator(news_dir).maker
  docs = maker.docs
  labels, short = [], []
  for epoch in range(3):
    inst = maker.plan(epoch)[0]
    doc_a = docs.document_of(inst.a_chunk[:, 0])
    is_next = inst.label == 0
    assert (inst.b_chunk[is_next, 0] == inst.a_chunk[is_next, 1]).all()
    assert (docs.document_of(inst.b_chunk[is_next, 1] - 1) == doc_a[is_next]).all()
    assert (docs.document_of(inst.b_chunk[~is_next, 0]) != doc_a[~is_next]).all()
    labels.append(inst.label)
    short.append(inst.target < 125)
  labels, short = np.concatenate(labels), np.concatenate(short)
  assert len(labels) > 4000
  assert abs(labels.mean() - 0.5) < 0.03
  assert abs(short.mean() - 0.1) < 0.02
  # Batches carry the labels of their instances.
  batch = next(_iterator(news_dir))
  np.testing.assert_array_equal(batch["next_sentence_labels"], maker.plan(0)[0].label[:64])


def test_packing_rows_respect_example_boundaries(news_dir, tok):
  it = _iterator(news_dir, packing=True, format="doc_sentences", short_seq_prob=0.7, max_examples_per_row=4)
  examples = 0
  for _ in range(3):
    batch = next(it)
    ids, ex, pos = _originals(batch), batch["example_ids"], batch["position_ids"]
    np.testing.assert_array_equal(batch["input_mask"], ex > 0)
    for r in range(len(ids)):
      n = int(batch["next_sentence_weights"][r].sum())
      assert n == ex[r].max() and (batch["next_sentence_weights"][r, :n] == 1).all()
      for k in range(1, n + 1):
        where = np.flatnonzero(ex[r] == k)
        assert (np.diff(where) == 1).all()  # contiguous
        assert where[0] == batch["next_sentence_positions"][r, k - 1]
        np.testing.assert_array_equal(pos[r, where], np.arange(len(where)))
        assert ids[r, where[0]] == tok.cls_id and ids[r, where[-1]] == tok.sep_id
        assert (batch["segment_ids"][r, where] == 0).all()
      examples += n
    masked_examples = np.take_along_axis(ex, batch["masked_lm_positions"], 1)
    assert (masked_examples[batch["masked_lm_weights"] > 0] > 0).all()
    assert (batch["masked_lm_weights"].sum(1) <= 20).all()
  assert examples > 3 * 64 * 1.25  # short instances do get packed together


_RESUME = textwrap.dedent("""
    import json, os, sys
    import numpy as np
    sys.path.insert(0, {repo!r})
    from configs import common
    from bert_jax.data import input_pipeline
    c = common.data_config()
    c.update(json.loads({config!r}))
    it = input_pipeline.create_pretrain_iterator(c, global_batch_size=96, process_index=0, process_count=1)
    it.set_state(json.loads({state!r}))
    np.savez({out!r}, **{{f"{{i}}/{{k}}": v for i in range({m}) for k, v in next(it).items()}})
    os._exit(0)   # written and closed: no interpreter exit waiting on tf.data's threads
""")


@pytest.mark.slow
def test_resume_in_a_fresh_process_is_byte_identical(news_dir, tmp_path):
  overrides = dict(seq_length=512, max_predictions_per_seq=76, whole_word_masking=True)
  it = _iterator(news_dir, global_batch_size=96, **overrides)
  n, m = 5, 5
  per_epoch = it.maker.num_rows(0) // 96
  assert n < per_epoch < n + m  # the resumed part crosses into the next epoch
  for _ in range(n):
    next(it)
  state = it.get_state()
  json.dumps(state)  # JSON-serialisable
  expected = [next(it) for _ in range(m)]
  script = _RESUME.format(repo=str(REPO_ROOT), config=_config(news_dir, **overrides).to_json(),
                          state=json.dumps(state), out=str(tmp_path / "resumed.npz"), m=m)
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  done = subprocess.run([sys.executable, "-c", script], env=env, timeout=900, capture_output=True, text=True,
                        stdin=subprocess.DEVNULL)
  assert done.returncode == 0, done.stderr[-4000:]   # the resumed process's own error, when it fails
  resumed = np.load(tmp_path / "resumed.npz")
  for i, batch in enumerate(expected):
    for k, v in batch.items():
      assert resumed[f"{i}/{k}"].tobytes() == v.tobytes(), (i, k)


def test_a_position_from_another_batch_size_or_seed_is_named(news_dir):
  state = _iterator(news_dir, global_batch_size=32).get_state()
  for changed, named in [(dict(global_batch_size=16), "global_batch_size"), (dict(seed=5), "data.seed")]:
    with pytest.raises(failures.UserError, match=named) as raised:
      _iterator(news_dir, **{"global_batch_size": 32, **changed}).set_state(state)
    assert "init_from" in str(raised.value)
  _iterator(news_dir, global_batch_size=32).set_state(state)   # the same pipeline takes it


def _document_set(docs):
  return {docs.tokens[docs.sentence_starts[s]:docs.sentence_starts[e]].tobytes()
          for s, e in zip(docs.doc_starts[:-1], docs.doc_starts[1:])}


@pytest.mark.parametrize("process_count", [2, 3])  # by file (2 shards), by document (3 > 2 shards)
def test_hosts_see_disjoint_documents(news_dir, process_count):
  files = shards.shard_files(news_dir, "train")
  assert len(files) == 2
  every = _document_set(shards.load_documents(files))
  hosts = [_document_set(shards.load_documents(files, h, process_count)) for h in range(process_count)]
  for h in range(process_count):
    assert len(hosts[h]) > 0.8 * len(every) / process_count
    for g in range(h):
      assert not hosts[h] & hosts[g]
  assert set().union(*hosts) == every
  its = [_iterator(news_dir, process_index=h, process_count=process_count, global_batch_size=6 * process_count)
         for h in range(process_count)]
  batches = [next(it) for it in its]
  assert all(b["input_ids"].shape == (6, 128) for b in batches)
  assert not np.array_equal(batches[0]["input_ids"], batches[1]["input_ids"])


def test_stream_is_a_function_of_seed_and_epoch(news_dir):
  a, b = _iterator(news_dir), _iterator(news_dir)
  for _ in range(2):
    x, y = next(a), next(b)
    assert all(np.array_equal(x[k], y[k]) for k in x)
  parallel = _iterator(news_dir, num_parallel_calls=2, prefetch=4)
  for _ in range(2):
    next(parallel)
  x, y = next(a), next(parallel)
  assert all(np.array_equal(x[k], y[k]) for k in x)  # threads change the speed, not the stream
  other_seed = next(_iterator(news_dir, seed=1))
  assert not np.array_equal(other_seed["input_ids"], next(_iterator(news_dir))["input_ids"])
  maker = a.maker
  rows = np.arange(64)
  epoch0, epoch1 = maker.batch(0, rows), maker.batch(1, rows)
  assert not np.array_equal(epoch0["masked_lm_positions"], epoch1["masked_lm_positions"])


def _epoch_rows(maker, epoch):
  """Every row of an epoch (tokens as masked, and the masked positions), as a sorted list of bytes."""
  batch = maker.batch(epoch, np.arange(maker.num_rows(epoch)))
  return [a.tobytes() + b.tobytes() for a, b in zip(batch["input_ids"], batch["masked_lm_positions"])]


@pytest.mark.slow
def test_static_masking_repeats_each_copy_in_a_new_order(news_dir):
  """dupe_factor D: epoch e holds exactly copy e % D's instances and masks, reordered; other copies differ."""
  maker = _iterator(news_dir, dupe_factor=2).maker
  e0, e1, e2 = (_epoch_rows(maker, e) for e in range(3))
  assert sorted(e0) == sorted(e2) and e0 != e2            # same instances and masks, a new order
  assert len(set(e0) & set(e1)) < len(e0) // 10           # the other copy: other instances and masks
  dynamic = _iterator(news_dir).maker
  assert sorted(_epoch_rows(dynamic, 0)) != sorted(_epoch_rows(dynamic, 2))
  once = _iterator(news_dir, dupe_factor=1).maker
  assert sorted(_epoch_rows(once, 0)) == sorted(_epoch_rows(once, 1))
  held_out = [next(input_pipeline.create_eval_iterator(_config(news_dir, dupe_factor=d), global_batch_size=64))
              for d in (0, 2)]
  assert all(np.array_equal(held_out[0][k], held_out[1][k]) for k in held_out[0])


def test_eval_is_fixed_finite_and_held_out(news_dir):
  config = _config(news_dir)
  make = lambda: input_pipeline.create_eval_iterator(config, global_batch_size=16, process_index=0,  # noqa: E731
                                                     process_count=1)
  first, second = list(make()), list(make())
  assert len(first) == len(second) == make().num_batches > 0
  for x, y in zip(first, second):
    assert all(np.array_equal(x[k], y[k]) for k in x)
  train_docs = _iterator(news_dir).maker.docs
  eval_docs = make().maker.docs
  assert 0 < eval_docs.num_documents < 0.15 * train_docs.num_documents
  assert not _document_set(train_docs) & _document_set(eval_docs)
  capped = input_pipeline.create_eval_iterator(config, global_batch_size=16, num_batches=50,
                                               process_index=0, process_count=1)
  assert len(list(capped)) == 50  # wraps around: every host can run the same number of eval steps


@pytest.mark.parametrize("fmt,packing", [("sop", False), ("full_sentences", False), ("nsp", True),
                                        ("sentence_pair", False)])
def test_other_formats_make_valid_batches(news_dir, tok, fmt, packing):
  batch = next(_iterator(news_dir, format=fmt, packing=packing, max_examples_per_row=2))
  ids = _originals(batch)
  assert ("next_sentence_labels" in batch) == (fmt != "full_sentences")
  assert (ids[:, 0] == tok.cls_id).all()
  length = batch["input_mask"].sum(1)
  assert (ids[np.arange(64), length - 1] == tok.sep_id).all()
  if fmt == "full_sentences":  # one segment, documents joined by [SEP]
    assert (batch["segment_ids"] == 0).all()
    assert ((ids == tok.sep_id).sum(1) > 1).any()
  if fmt == "sentence_pair":   # [CLS] sentence [SEP] sentence [SEP]: two segments, three special tokens
    assert ((ids == tok.sep_id).sum(1) == 2).all() and (batch["segment_ids"].max(1) == 1).all()
  if packing:
    assert batch["next_sentence_labels"].shape == (64, 2)
    assert set(np.unique(batch["next_sentence_labels"][batch["next_sentence_weights"] > 0])) == {0, 1}


def test_the_tokenizer_beside_shards_named_in_the_current_directory(news_dir, monkeypatch):
  """A glob typed inside the prepared directory (`train-*`) finds the tokenizer `prepare` saved there."""
  monkeypatch.chdir(news_dir)
  tok = input_pipeline.load_tokenizer(_config("train-*.tfrecord"))
  assert tok.vocab_size == tokenizer.load_tokenizer(news_dir).vocab_size

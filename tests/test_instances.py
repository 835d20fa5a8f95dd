"""Instance planning, truncation, row building and packing on synthetic documents."""

import numpy as np
import pytest

from bert_jax.data import instances

CLS, SEP, PAD = 2, 3, 0


def _documents(n_docs=60, seed=0) -> instances.Documents:
  rng = np.random.default_rng(seed)
  sentences_per_doc = rng.integers(1, 16, n_docs)
  lengths = rng.integers(1, 60, sentences_per_doc.sum())
  return instances.Documents(tokens=rng.integers(5, 1000, lengths.sum()).astype(np.int32),
                             sentence_starts=np.concatenate([[0], np.cumsum(lengths)]),
                             doc_starts=np.concatenate([[0], np.cumsum(sentences_per_doc)]))


def _plan(fmt, seq_length=128, seed=0, docs=None, short_seq_prob=0.1):
  docs = docs or _documents()
  separator = None
  if fmt == "full_sentences":
    docs, separator = docs.joined(SEP), SEP
  return docs, instances.plan(docs, fmt, seq_length, short_seq_prob, np.random.default_rng(seed), separator)


def _inside(inner_start, inner_len, chunk):
  return (inner_start >= chunk[:, 0]) & (inner_start + inner_len <= chunk[:, 1])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_nsp_pairs(seed):
  docs, inst = _plan("nsp", seed=seed)
  doc_a = docs.document_of(inst.a_chunk[:, 0])
  assert (docs.document_of(inst.a_chunk[:, 1] - 1) == doc_a).all()
  is_next = inst.label == 0
  # IsNext: B is the chunk right after A in the same document; NotNext: B from another document.
  assert (inst.b_chunk[is_next, 0] == inst.a_chunk[is_next, 1]).all()
  assert (docs.document_of(inst.b_chunk[:, 1] - 1)[is_next] == doc_a[is_next]).all()
  assert (docs.document_of(inst.b_chunk[~is_next, 0]) != doc_a[~is_next]).all()
  assert (docs.document_of(inst.b_chunk[:, 0]) == docs.document_of(inst.b_chunk[:, 1] - 1)).all()
  # Truncation keeps a part of each chunk and the whole within [CLS] A [SEP] B [SEP].
  assert _inside(inst.a_start, inst.a_len, inst.a_chunk).all()
  assert _inside(inst.b_start, inst.b_len, inst.b_chunk).all()
  assert (inst.a_len >= 1).all() and (inst.b_len >= 1).all()
  assert (inst.lengths() <= 128).all()
  # Chunks start on sentence boundaries (A always; B too unless a sentence was split).
  assert np.isin(inst.a_chunk[:, 0], docs.sentence_starts).all()


def test_nsp_labels_balanced_and_short_targets():
  _, inst = _plan("nsp", seq_length=64, docs=_documents(n_docs=1000))
  assert len(inst) > 4000
  assert abs(inst.label.mean() - 0.5) < 0.03
  assert abs((inst.target < 61).mean() - 0.1) < 0.02
  assert (inst.target[inst.target < 61] >= 2).all()


def test_sop_pairs_are_consecutive_and_swapped_half_the_time():
  docs, inst = _plan("sop", seq_length=64, docs=_documents(n_docs=1000))
  in_order, swapped = inst.label == 0, inst.label == 1
  assert (inst.b_chunk[in_order, 0] == inst.a_chunk[in_order, 1]).all()
  assert (inst.a_chunk[swapped, 0] == inst.b_chunk[swapped, 1]).all()
  assert (docs.document_of(inst.a_chunk[:, 0]) == docs.document_of(inst.b_chunk[:, 1] - 1)).all()
  assert abs(inst.label.mean() - 0.5) < 0.03


def test_sentence_pairs_are_single_sentences_next_or_from_another_document():
  docs, inst = _plan("sentence_pair", seq_length=64, docs=_documents(n_docs=1000))
  starts = docs.sentence_starts
  # A and B are one whole sentence each before truncation.
  for chunk in (inst.a_chunk, inst.b_chunk):
    index = np.searchsorted(starts, chunk[:, 0])
    assert (starts[index] == chunk[:, 0]).all() and (starts[index + 1] == chunk[:, 1]).all()
  doc_a, doc_b = docs.document_of(inst.a_chunk[:, 0]), docs.document_of(inst.b_chunk[:, 0])
  is_next = inst.label == 0
  assert (inst.b_chunk[is_next, 0] == inst.a_chunk[is_next, 1]).all() and (doc_b == doc_a)[is_next].all()
  assert (doc_b != doc_a)[~is_next].all()
  assert abs(inst.label.mean() - 0.5) < 0.03 and (inst.lengths() <= 64).all() and (inst.a_len >= 1).all()
  # Each sentence is an A at most once, and a followed sentence never starts a pair of its own.
  assert len(np.unique(inst.a_chunk[:, 0])) == len(inst)
  assert not np.isin(inst.b_chunk[is_next, 0], inst.a_chunk[:, 0]).any()
  with pytest.raises(ValueError, match="two documents"):
    _plan("sentence_pair", docs=_documents(n_docs=1))


def test_sentence_pair_labels_are_balanced_with_short_documents():
  """A document's last sentence starts no pair: drawn there, a random B alone (a real next cannot be)
  made 60% of the labels 1 with two sentences a document."""
  n = 5000
  docs = instances.Documents(tokens=np.arange(2 * n * 8, dtype=np.int32) % 1000 + 5,
                             sentence_starts=np.arange(2 * n + 1, dtype=np.int64) * 8,
                             doc_starts=np.arange(n + 1, dtype=np.int64) * 2)
  inst = instances.plan(docs, "sentence_pair", 64, 0.1, np.random.default_rng(0))
  assert len(inst) == n and abs(inst.label.mean() - 0.5) < 0.025


def test_doc_sentences_stay_in_one_document():
  docs, inst = _plan("doc_sentences")
  assert (inst.b_len == 0).all()
  assert (docs.document_of(inst.a_chunk[:, 0]) == docs.document_of(inst.a_chunk[:, 1] - 1)).all()
  assert np.isin(inst.a_chunk, docs.sentence_starts).all()  # whole sentences
  assert (inst.lengths() <= 128).all()
  # Every sentence is used exactly once per epoch.
  assert (inst.a_chunk[:, 1] - inst.a_chunk[:, 0]).sum() == len(docs.tokens)


def test_full_sentences_cross_documents_with_a_separator():
  original = _documents()
  docs, inst = _plan("full_sentences", docs=original)
  rows = instances.build_rows(docs.tokens, inst, 128, CLS, SEP, PAD)
  inner_sep = (rows["input_ids"][:, 1:] == SEP) & (rows["input_mask"][:, 1:] == 1)
  inner_sep &= np.arange(1, 128)[None, :] < inst.lengths()[:, None] - 1
  assert inner_sep.any(1).mean() > 0.15  # rows span document boundaries
  first_tokens = docs.tokens[inst.a_chunk[:, 0]]
  assert (first_tokens != SEP).all() and (docs.tokens[inst.a_chunk[:, 1] - 1] != SEP).all()
  assert len(docs.tokens) == len(original.tokens) + original.num_documents - 1
  separators = docs.sentence_starts[original.doc_starts[1:-1] + np.arange(original.num_documents - 1)]
  assert (docs.tokens[separators] == SEP).all()
  np.testing.assert_array_equal(np.delete(docs.tokens, separators), original.tokens)


def test_truncation_matches_the_reference_loop():
  rng = np.random.default_rng(0)
  la, lb = rng.integers(1, 300, 2000), rng.integers(0, 300, 2000)
  inst = instances._truncated(np.zeros_like(la), la, np.zeros_like(lb), lb, np.zeros_like(la),
                              la, 125, rng)
  for i in range(len(la)):
    a, b = la[i], lb[i]
    while a + b > 125:  # google-research/bert truncate_seq_pair
      if a > b:
        a -= 1
      else:
        b -= 1
    assert (inst.a_len[i], inst.b_len[i]) == (a, b)
  removed_front = inst.a_start.sum() / max((la - inst.a_len).sum(), 1)
  assert abs(removed_front - 0.5) < 0.02  # front or back with equal probability


def test_build_rows_matches_a_plain_construction():
  docs, inst = _plan("nsp", seq_length=64)
  rows = instances.build_rows(docs.tokens, inst, 64, CLS, SEP, PAD)
  for i in range(0, len(inst), 7):
    a = docs.tokens[inst.a_start[i]:inst.a_start[i] + inst.a_len[i]].tolist()
    b = docs.tokens[inst.b_start[i]:inst.b_start[i] + inst.b_len[i]].tolist()
    ids = [CLS] + a + [SEP] + b + [SEP]
    segments = [0] * (len(a) + 2) + [1] * (len(b) + 1)
    pad = 64 - len(ids)
    assert rows["input_ids"][i].tolist() == ids + [PAD] * pad
    assert rows["segment_ids"][i].tolist() == segments + [0] * pad
    assert rows["input_mask"][i].tolist() == [1] * len(ids) + [0] * pad


def test_packing_respects_capacity_and_order():
  rng = np.random.default_rng(0)
  lengths = rng.integers(5, 60, 500)
  starts = instances.pack(lengths, 128, 4)
  assert starts[0] == 0 and starts[-1] == 500 and (np.diff(starts) >= 1).all()
  per_row = np.add.reduceat(lengths, starts[:-1])
  assert (per_row <= 128).all() and (np.diff(starts) <= 4).all()
  # Next-fit: a row was closed only because the next instance did not fit (or K was reached).
  closed = starts[1:-1]
  assert ((per_row[:-1] + lengths[closed] > 128) | (np.diff(starts)[:-1] == 4)).all()
  row, slot, offset = instances.packed_layout(starts, lengths)
  assert (offset + lengths <= 128).all() and (slot < 4).all()
  assert (offset[slot == 0] == 0).all()


def _electra_reference(lengths_per_doc, max_length, rng):
  """google-research/electra build_pretraining_dataset.py `ExampleBuilder` (add_line, _create_example) on
  sentence lengths: (len A, len B) per example."""
  examples = []
  current, target = [], max_length

  def create():
    nonlocal current, target
    first_target = 100000 if rng.random() < 0.1 else (target - 3) // 2
    first, second = [], []
    for sentence in current:
      if (not first or len(first) + sentence < first_target
          or (not second and len(first) < first_target and rng.random() < 0.5)):
        first += [0] * sentence
      else:
        second += [0] * sentence
    first = first[:max_length - 2]
    second = second[:max(0, max_length - len(first) - 3)]
    current = []
    target = int(rng.integers(5, max_length, endpoint=True)) if rng.random() < 0.05 else max_length
    examples.append((len(first), len(second)))

  for doc in lengths_per_doc:
    for sentence in doc:
      current.append(sentence)
      if sum(current) >= target:
        create()
    if current:   # the blank line between documents
      create()
  return np.array(examples)


def test_doc_segments_follow_electras_example_builder():
  """One or two segments of one document, B right after A, no label; the rows' shapes as the reference's."""
  docs, inst = _plan("doc_segments", short_seq_prob=0.05)
  assert (inst.label == 0).all() and (inst.lengths() <= 128).all()
  two = inst.b_len > 0
  assert (docs.document_of(inst.a_start) == docs.document_of(inst.a_start + inst.a_len - 1)).all()
  assert (docs.document_of(inst.a_start[two]) == docs.document_of(inst.b_start[two] + inst.b_len[two] - 1)).all()
  assert (inst.b_start[two] >= inst.a_start[two] + inst.a_len[two]).all()
  assert np.isin(inst.a_start, docs.sentence_starts).all() and np.isin(inst.b_start[two], docs.sentence_starts).all()
  lengths = np.diff(docs.sentence_starts)
  per_doc = [lengths[docs.doc_starts[d]:docs.doc_starts[d + 1]].tolist() for d in range(docs.num_documents)]
  ref = np.concatenate([_electra_reference(per_doc, 128, np.random.default_rng(s)) for s in range(20)])
  ours = np.concatenate([np.stack([i.a_len, i.b_len], 1) for i in
                         (_plan("doc_segments", seed=s, short_seq_prob=0.05)[1] for s in range(20))])
  assert abs(len(ours) - len(ref)) <= 0.02 * len(ref)
  assert abs((ours[:, 1] > 0).mean() - (ref[:, 1] > 0).mean()) < 0.03   # two segments: 0.69 of these rows
  assert abs(ours.sum(1).mean() / ref.sum(1).mean() - 1) < 0.03
  assert abs(ours[:, 0].mean() / ref[:, 0].mean() - 1) < 0.05

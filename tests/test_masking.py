"""Dynamic masking on synthetic batches: budgets, 80/10/10, whole words, spans, determinism."""

import numpy as np
import pytest

from bert_jax import masking

VOCAB, PAD, CLS, SEP, MASK = 1000, 0, 2, 3, 4


def _spec(**kwargs) -> masking.MaskingSpec:
  is_special = np.zeros(VOCAB, bool)
  is_special[:5] = True
  word_start = np.arange(VOCAB) % 2 == 0  # even ids start a word, odd ids continue one
  word_start[:5] = True
  return masking.MaskingSpec(mask_id=MASK, is_special=is_special, word_start=word_start,
                             random_ids=np.arange(5, VOCAB, dtype=np.int32), **kwargs)


def _batch(n=512, length=128, seed=0):
  """[CLS] A [SEP] B [SEP] [PAD]... rows of random lengths."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, VOCAB, (n, length))
  total = rng.integers(8, length + 1, n)
  la = rng.integers(1, total - 4)
  j = np.arange(length)[None, :]
  ids[:, 0] = CLS
  ids = np.where((j == la[:, None] + 1) | (j == total[:, None] - 1), SEP, ids)
  mask = (j < total[:, None]).astype(np.int32)
  return np.where(mask == 1, ids, PAD).astype(np.int32), mask


def _keys(n, epoch=0):
  return masking.example_keys(0, epoch, 0, np.arange(n))


def _words_of(ids, mask, spec):
  """Word index per token (python reference): a word starts at a word-start piece or after a special."""
  words = np.full(ids.shape, -1)
  for i in range(ids.shape[0]):
    w, prev_candidate = -1, False
    for j in range(ids.shape[1]):
      candidate = bool(mask[i, j]) and not spec.is_special[ids[i, j]]
      if candidate and (spec.word_start[ids[i, j]] or not prev_candidate):
        w += 1
      if candidate:
        words[i, j] = w
      prev_candidate = candidate
  return words


def test_token_masking_takes_fifteen_percent_of_maskable_tokens_and_never_specials():
  ids, mask = _batch()
  spec = _spec(max_predictions=128)
  corrupted, is_masked = masking.mask_batch(ids, mask, _keys(len(ids)), spec)
  maskable = (mask == 1) & ~spec.is_special[ids]
  expected = np.maximum(1, np.rint(maskable.sum(1) * 0.15))
  np.testing.assert_array_equal(is_masked.sum(1), expected)
  assert abs(is_masked.sum() / maskable.sum() - 0.15) < 0.01
  assert not (is_masked & ~maskable).any()
  assert (corrupted[~is_masked] == ids[~is_masked]).all()


def test_cap_on_predictions():
  ids, mask = _batch()
  _, is_masked = masking.mask_batch(ids, mask, _keys(len(ids)), _spec(max_predictions=5))
  maskable = ((mask == 1) & (ids > 4)).sum(1)
  np.testing.assert_array_equal(is_masked.sum(1), np.minimum(5, np.maximum(1, np.rint(maskable * 0.15))))


@pytest.mark.parametrize("mask_p,random_p", [(0.8, 0.1), (0.5, 0.3)])
def test_replacement_proportions(mask_p, random_p):
  ids, mask = _batch(n=2048)
  spec = _spec(max_predictions=128, mask_token_prob=mask_p, random_token_prob=random_p)
  corrupted, is_masked = masking.mask_batch(ids, mask, _keys(len(ids)), spec)
  new, old = corrupted[is_masked], ids[is_masked]
  assert is_masked.sum() > 20_000
  assert abs((new == MASK).mean() - mask_p) < 0.02
  assert abs((new == old).mean() - (1 - mask_p - random_p)) < 0.02
  replaced = (new != MASK) & (new != old)
  assert abs(replaced.mean() - random_p) < 0.02
  assert not spec.is_special[new[replaced]].any()


def test_masks_depend_only_on_each_examples_key():
  ids, mask = _batch(n=64)
  spec = _spec()
  keys = _keys(64)
  whole, whole_masked = masking.mask_batch(ids, mask, keys, spec)
  part, part_masked = masking.mask_batch(ids[10:20], mask[10:20], keys[10:20], spec)
  np.testing.assert_array_equal(whole[10:20], part)
  np.testing.assert_array_equal(whole_masked[10:20], part_masked)
  _, other_epoch = masking.mask_batch(ids, mask, _keys(64, epoch=1), spec)
  assert (other_epoch != whole_masked).any()


def test_whole_word_masking_never_splits_a_word_and_is_the_greedy_scan():
  ids, mask = _batch(n=128)
  spec = _spec(max_predictions=20, scheme="word")
  keys = _keys(len(ids))
  _, is_masked = masking.mask_batch(ids, mask, keys, spec)
  words = _words_of(ids, mask, spec)
  order_u = masking.uniform(keys, masking._CHOICE, ids.shape[1])  # the word order the scheme uses
  for i in range(len(ids)):
    n_words = words[i].max() + 1
    lengths = np.bincount(words[i][words[i] >= 0], minlength=n_words)
    for w in range(n_words):
      assert is_masked[i][words[i] == w].all() or not is_masked[i][words[i] == w].any()
    budget = min(20, max(1, round(lengths.sum() * 0.15)))
    expected, left = np.zeros(n_words, bool), budget
    for w in np.argsort(np.where(np.arange(len(order_u[i])) < n_words, order_u[i], 2.0))[:n_words]:
      if lengths[w] <= left:  # google-research/bert: skip a word that would exceed the budget
        expected[w], left = True, left - lengths[w]
    np.testing.assert_array_equal(is_masked[i][words[i] >= 0], expected[words[i][words[i] >= 0]])


def test_span_lengths_follow_the_truncated_geometric_law():
  lengths = masking.span_lengths(masking.uniform(_keys(1), 0, 200_000)[0], 0.2, 10)
  k = np.arange(1, 11)
  pmf = 0.2 * 0.8 ** (k - 1) / (1 - 0.8 ** 10)
  observed = np.bincount(lengths, minlength=11)[1:] / len(lengths)
  np.testing.assert_allclose(observed, pmf, atol=0.004)
  assert abs(lengths.mean() - (k * pmf).sum()) < 0.02
  assert abs((k * pmf).sum() - 3.8) < 0.05  # SpanBERT, Joshi et al. 2020, 3.1: mean span 3.8 words


def test_span_masking_covers_whole_words_within_budget():
  ids, mask = _batch(n=128)
  spec = _spec(max_predictions=20, scheme="span")
  corrupted, is_masked = masking.mask_batch(ids, mask, _keys(len(ids)), spec)
  words = _words_of(ids, mask, spec)
  maskable = (mask == 1) & ~spec.is_special[ids]
  budget = np.minimum(20, np.maximum(1, np.rint(maskable.sum(1) * 0.15)))
  assert (is_masked.sum(1) <= budget).all()
  assert is_masked.sum() > 0.9 * budget.sum()
  assert not (is_masked & ~maskable).any()
  for i in range(len(ids)):
    for w in np.unique(words[i][is_masked[i]]):
      assert is_masked[i][words[i] == w].all()
  # Per-span 80/10/10: tokens of one contiguous masked run mostly share their fate.
  assert abs((corrupted[is_masked] == MASK).mean() - 0.8) < 0.1


def test_gather_predictions_keeps_the_cap_and_restores_the_rest():
  original = np.arange(12, dtype=np.int32).reshape(2, 6) + 10
  is_masked = np.array([[1, 0, 1, 1, 0, 1], [0, 1, 0, 0, 0, 0]], bool)
  corrupted = np.where(is_masked, MASK, original)
  out = masking.gather_predictions(corrupted, original, is_masked, 3)
  np.testing.assert_array_equal(out["masked_lm_positions"], [[0, 2, 3], [1, 0, 0]])
  np.testing.assert_array_equal(out["masked_lm_ids"], [[10, 12, 13], [17, 0, 0]])
  np.testing.assert_array_equal(out["masked_lm_weights"], [[1, 1, 1], [1, 0, 0]])
  assert out["input_ids"][0, 5] == 15  # over the cap: back to the original token

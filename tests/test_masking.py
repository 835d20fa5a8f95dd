"""Dynamic masking on synthetic batches: google-research/bert's budget, candidates and replacements,
the switches that depart from them, 80/10/10, whole words, spans, ALBERT n-grams, span boundaries,
determinism."""

import dataclasses

import numpy as np
import pytest

from bert_jax.data import masking
from configs import common

VOCAB, PAD, UNK, CLS, SEP, MASK = 1000, 0, 1, 2, 3, 4
# The deviations docs/fidelity.md lists, all switched on: the masking of earlier versions.
OLD_RULES = {"masking_budget": "maskable_tokens", "mask_unk": False, "random_token_pool": "non_special"}


class _Tokenizer:
  vocab_size, pad_id, unk_id, cls_id, sep_id, mask_id = VOCAB, PAD, UNK, CLS, SEP, MASK
  special_ids = np.arange(5)

  def word_start_table(self):
    table = np.arange(VOCAB) % 2 == 0  # even ids start a word, odd ids continue one
    table[:5] = True
    return table


def _spec(data=(), **fields) -> masking.MaskingSpec:
  """`MaskingSpec.from_config` of the default data config with `data` overrides, then `fields`."""
  c = common.data_config()
  c.update(dict(data))
  return dataclasses.replace(masking.MaskingSpec.from_config(c, _Tokenizer()), **fields)


def _batch(n=512, length=128, seed=0, unk_rate=0.0, mask_rate=0.0):
  """[CLS] A [SEP] B [SEP] [PAD]... rows of random lengths; text tokens are [UNK]/[MASK] at the given rates."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, VOCAB, (n, length))
  u = rng.random((n, length))
  ids = np.where(u < unk_rate, UNK, np.where(u > 1 - mask_rate, MASK, ids))
  total = rng.integers(8, length + 1, n)
  la = rng.integers(1, total - 4)
  j = np.arange(length)[None, :]
  ids[:, 0] = CLS
  ids = np.where((j == la[:, None] + 1) | (j == total[:, None] - 1), SEP, ids)
  mask = (j < total[:, None]).astype(np.int32)
  return np.where(mask == 1, ids, PAD).astype(np.int32), mask


def _keys(n, epoch=0):
  return masking.example_keys(0, epoch, 0, np.arange(n))


def _candidates(ids, mask, spec):
  return (mask == 1) & ~spec.never_mask[ids]


def _words_of(ids, mask, spec):
  """Word index per token (python reference): a word starts at a word-start piece or after a non-candidate."""
  words = np.full(ids.shape, -1)
  for i in range(ids.shape[0]):
    w, prev_candidate = -1, False
    for j in range(ids.shape[1]):
      candidate = bool(mask[i, j]) and not spec.never_mask[ids[i, j]]
      if candidate and (spec.word_start[ids[i, j]] or not prev_candidate):
        w += 1
      if candidate:
        words[i, j] = w
      prev_candidate = candidate
  return words


def test_token_masking_takes_fifteen_percent_of_real_tokens_never_cls_sep_or_padding():
  ids, mask = _batch()
  spec = _spec(max_predictions=128)
  corrupted, is_masked = masking.mask_batch(ids, mask, _keys(len(ids)), spec)
  np.testing.assert_array_equal(is_masked.sum(1), np.maximum(1, np.rint(mask.sum(1) * 0.15)))
  assert abs(is_masked.sum() / mask.sum() - 0.15) < 0.01
  assert not (is_masked & ~_candidates(ids, mask, spec)).any()
  assert not np.isin(ids[is_masked], [CLS, SEP, PAD]).any()
  assert (corrupted[~is_masked] == ids[~is_masked]).all()


@pytest.mark.parametrize("cap", [20, 80])
def test_budget_is_the_reference_formula_for_every_length(cap):
  """google-research/bert: min(max_predictions_per_seq, max(1, int(round(len(tokens) * masked_lm_prob))))
  with [CLS] and [SEP] in `tokens`; rows [CLS] A [SEP] B [SEP] of 4..512 tokens."""
  lengths = np.arange(4, 513)
  j = np.arange(512)[None, :]
  ids = np.where(j < lengths[:, None], 5 + j % 900, PAD)
  ids[:, 0] = CLS
  ids[np.arange(len(lengths)), lengths - 1] = SEP
  ids[np.arange(len(lengths)), lengths // 2] = SEP
  mask = (j < lengths[:, None]).astype(np.int32)
  for rules, counted in (({}, lengths), (OLD_RULES, lengths - 3)):
    _, is_masked = masking.mask_batch(ids, mask, _keys(len(ids)), _spec(rules, max_predictions=cap))
    want = [min(cap, max(1, int(round(n * 0.15)))) for n in counted]
    np.testing.assert_array_equal(is_masked.sum(1), want)
  full = _spec(max_predictions=80)
  assert masking.prediction_budget(ids[-1:], mask[-1:], full)[0] == 77   # round(512 * 0.15)
  assert masking.prediction_budget(ids[-1:], mask[-1:], _spec(OLD_RULES, max_predictions=80))[0] == 76
  assert masking.prediction_budget(ids[:1], np.zeros_like(mask[:1]), full)[0] == 0   # nothing to choose


def test_cap_on_predictions():
  ids, mask = _batch()
  _, is_masked = masking.mask_batch(ids, mask, _keys(len(ids)), _spec(max_predictions=5))
  np.testing.assert_array_equal(is_masked.sum(1), np.minimum(5, np.maximum(1, np.rint(mask.sum(1) * 0.15))))


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


@pytest.mark.parametrize("pool", ["vocab", "non_special"])
def test_random_replacements_come_from_the_whole_vocabulary(pool):
  ids, mask = _batch(n=4096)
  spec = _spec({"random_token_pool": pool}, max_predictions=128, mask_token_prob=0.0, random_token_prob=1.0)
  corrupted, is_masked = masking.mask_batch(ids, mask, _keys(len(ids)), spec)
  drawn = corrupted[is_masked]   # every chosen token got a random one (possibly itself)
  assert len(drawn) > 40_000
  counts = np.bincount(drawn, minlength=VOCAB)
  if pool == "vocab":   # google-research/bert: vocab_words[randint(0, len(vocab_words) - 1)]
    assert abs(counts[:5].sum() / len(drawn) - 5 / VOCAB) < 0.0015
    assert (counts[:5] > 0).all()   # [PAD], [UNK], [CLS], [SEP], [MASK] each appear
  else:
    assert counts[:5].sum() == 0 and (counts[5:] > 0).all()


def test_unk_and_mask_in_the_text_are_ordinary_tokens():
  ids, mask = _batch(n=2048, unk_rate=0.1, mask_rate=0.05)
  keys = _keys(len(ids))
  _, is_masked = masking.mask_batch(ids, mask, keys, _spec(max_predictions=128))
  rate = is_masked.sum() / _candidates(ids, mask, _spec()).sum()
  for token in (UNK, MASK):
    at_token = (mask == 1) & (ids == token)
    assert at_token.sum() > 5_000
    assert abs(is_masked[at_token].mean() - rate) < 0.01   # chosen as often as any other token
  _, old = masking.mask_batch(ids, mask, keys, _spec({"mask_unk": False}, max_predictions=128))
  assert not np.isin(ids[old], [UNK, MASK, CLS, SEP, PAD]).any()


def test_old_rules_restore_the_earlier_masking():
  ids, mask = _batch(unk_rate=0.05)
  spec = _spec(OLD_RULES, max_predictions=128, mask_token_prob=0.0, random_token_prob=1.0)
  corrupted, is_masked = masking.mask_batch(ids, mask, _keys(len(ids)), spec)
  maskable = (mask == 1) & (ids >= 5)
  np.testing.assert_array_equal(is_masked.sum(1), np.maximum(1, np.rint(maskable.sum(1) * 0.15)))
  assert not (is_masked & ~maskable).any()
  assert (corrupted[is_masked] >= 5).all()


@pytest.mark.parametrize("field, value", [("masking_budget", "all"), ("random_token_pool", "specials")])
def test_unknown_switch_values_are_rejected(field, value):
  with pytest.raises(ValueError, match=field):
    _spec({field: value})


@pytest.mark.parametrize("scheme", ["token", "span", "ngram"])
def test_masks_depend_only_on_each_examples_key(scheme):
  ids, mask = _batch(n=64)
  spec = _spec(scheme=scheme)
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
    budget = min(20, max(1, round(mask[i].sum() * 0.15)))  # [CLS] and [SEP] count
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
  maskable = _candidates(ids, mask, spec)
  budget = np.minimum(20, np.maximum(1, np.rint(mask.sum(1) * 0.15)))
  assert (is_masked.sum(1) <= budget).all()
  assert is_masked.sum() > 0.9 * budget.sum()
  assert not (is_masked & ~maskable).any()
  for i in range(len(ids)):
    for w in np.unique(words[i][is_masked[i]]):
      assert is_masked[i][words[i] == w].all()
  # Per-span 80/10/10: tokens of one contiguous masked run mostly share their fate.
  assert abs((corrupted[is_masked] == MASK).mean() - 0.8) < 0.1


def test_span_starts_are_drawn_over_tokens_so_long_words_start_more_spans():
  """SpanBERT's code draws a span's start among the tokens and takes it back to its word's start: a word of
  three pieces is masked more often than a word of one (drawn among words, both alike)."""
  n, length = 512, 128
  rng = np.random.default_rng(0)
  ids = np.full((n, length), PAD, np.int64)
  pieces = np.zeros((n, length), np.int64)   # per token, the length of its word
  for i in range(n):
    j = 1
    while j < length - 4:
      k = int(rng.choice([1, 3]))
      ids[i, j] = 2 * rng.integers(3, VOCAB // 2)        # an even id starts a word
      ids[i, j + 1:j + k] = 2 * rng.integers(3, VOCAB // 2, k - 1) + 1
      pieces[i, j:j + k] = k
      j += k
    ids[i, 0], ids[i, j] = CLS, SEP
  mask = (ids != PAD).astype(np.int32)
  _, is_masked = masking.mask_batch(ids.astype(np.int32), mask, _keys(n), _spec(max_predictions=20, scheme="span"))
  starts = (pieces > 0) & _Tokenizer().word_start_table()[ids]
  run_start = is_masked & ~np.pad(is_masked[:, :-1], ((0, 0), (1, 0)))   # where a masked run begins
  rate = {k: run_start[starts & (pieces == k)].mean() for k in (1, 3)}
  assert rate[3] > 1.15 * rate[1], rate   # 1.34 (drawn among words: 0.61, a long word costs more budget)


def test_gather_predictions_keeps_the_cap_and_restores_the_rest():
  original = np.arange(12, dtype=np.int32).reshape(2, 6) + 10
  is_masked = np.array([[1, 0, 1, 1, 0, 1], [0, 1, 0, 0, 0, 0]], bool)
  corrupted = np.where(is_masked, MASK, original)
  out = masking.gather_predictions(corrupted, original, is_masked, 3)
  np.testing.assert_array_equal(out["masked_lm_positions"], [[0, 2, 3], [1, 0, 0]])
  np.testing.assert_array_equal(out["masked_lm_ids"], [[10, 12, 13], [17, 0, 0]])
  np.testing.assert_array_equal(out["masked_lm_weights"], [[1, 1, 1], [1, 0, 0]])
  assert out["input_ids"][0, 5] == 15  # over the cap: back to the original token


def test_ngram_lengths_follow_one_over_n():
  """ALBERT, Lan et al. 2019, 4.1: p(n) = (1/n) / sum_k (1/k) for n = 1..3."""
  lengths = masking.ngram_lengths(masking.uniform(_keys(1), 0, 200_000)[0], 3)
  observed = np.bincount(lengths, minlength=4)[1:] / len(lengths)
  np.testing.assert_allclose(observed, np.array([6, 3, 2]) / 11, atol=0.004)
  assert lengths.min() == 1 and lengths.max() == 3


def _albert_scan(lengths, budget, starts, ngram_len):
  """google-research/albert `create_masked_lm_predictions`' loop (python reference) over word lengths:
  every word once as an n-gram start, shortened to fit the budget, skipped when it overlaps."""
  taken, count, grams = set(), 0, []
  for r, start in enumerate(starts):
    if count >= budget:
      break
    words = list(range(start, min(start + ngram_len[r], len(lengths))))
    while len(words) > 1 and count + lengths[words].sum() > budget:  # "trying shorter ngrams"
      words.pop()
    if count + lengths[words].sum() > budget or taken & set(words):
      continue
    taken, count = taken | set(words), count + lengths[words].sum()
    grams.append(len(words))
  return taken, grams


@pytest.mark.parametrize("cap", [20, 80])
def test_ngram_masking_is_the_albert_scan(cap):
  ids, mask = _batch(n=128)
  spec = _spec({"ngram_masking": True}, max_predictions=cap)
  assert spec.scheme == "ngram"
  keys = _keys(len(ids))
  corrupted, is_masked = masking.mask_batch(ids, mask, keys, spec)
  words = _words_of(ids, mask, spec)
  budget = np.minimum(cap, np.maximum(1, np.rint(mask.sum(1) * 0.15)))
  start_u = masking.uniform(keys, masking._CHOICE, ids.shape[1])  # the draws the scheme uses
  ngram_len = masking.ngram_lengths(masking.uniform(keys, masking._SPAN_LENGTH, ids.shape[1]), 3)
  all_grams = []
  for i in range(len(ids)):
    n_words = words[i].max() + 1
    lengths = np.bincount(words[i][words[i] >= 0], minlength=n_words)
    starts = np.argsort(np.where(np.arange(ids.shape[1]) < n_words, start_u[i], 2.0))[:n_words]
    taken, grams = _albert_scan(lengths, budget[i], starts, ngram_len[i])
    np.testing.assert_array_equal(is_masked[i][words[i] >= 0], np.isin(words[i][words[i] >= 0], list(taken)))
    all_grams += grams
  assert (is_masked.sum(1) <= budget).all()
  assert is_masked.sum() > 0.9 * budget.sum()
  assert not (is_masked & ~_candidates(ids, mask, spec)).any()
  assert max(all_grams) == 3 and min(all_grams) == 1
  assert abs((corrupted[is_masked] == MASK).mean() - 0.8) < 0.03   # 80/10/10 per token


def test_ngram_lengths_in_the_masks():
  """The first n-gram of each row is never shortened nor dropped: its lengths follow 1/n; none exceeds 3."""
  n, length = 8192, 512
  ids, mask = _batch(n=n, length=length, seed=3)
  mask[:] = 1
  ids = np.where(ids > SEP, ids - ids % 2, ids)   # one-piece words: n-gram length = its tokens
  spec = _spec({"ngram_masking": True})
  word_id, word_len = masking._words(ids, _candidates(ids, mask, spec), spec.word_start)
  taken, gram_of_word = masking._choose_ngrams(word_len, masking.prediction_budget(ids, mask, spec), _keys(n), 3)
  rows = np.nonzero(taken)[0]
  grams, sizes = np.unique(rows * length + gram_of_word[taken], return_counts=True)
  assert sizes.max() == 3
  first = sizes[np.unique(grams // length, return_index=True)[1]]
  np.testing.assert_allclose(np.bincount(first, minlength=4)[1:] / n, np.array([6, 3, 2]) / 11, atol=0.02)


def test_at_most_one_scheme_switch():
  with pytest.raises(ValueError, match="at most one"):
    _spec({"span_masking": True, "ngram_masking": True})


def test_span_boundaries_of_hand_made_rows():
  #                  0  1  2  3  4  5  6  7  8  9
  is_masked = np.array([[0, 1, 1, 1, 0, 1, 0, 0, 1, 1],    # two runs; the second ends at the last token
                        [1, 0, 1, 1, 1, 1, 0, 0, 0, 0]], bool)  # a run at 0; cap 4 restores position 5
  input_mask = np.array([[1] * 10, [1] * 7 + [0] * 3])
  ids = np.arange(20).reshape(2, 10) + 10
  out = masking.gather_predictions(ids, ids, is_masked, 4)
  got = masking.span_boundaries(out["masked_lm_positions"], out["masked_lm_weights"], input_mask, max_offset=1)
  np.testing.assert_array_equal(got["masked_lm_span_left"], [[0, 0, 0, 4], [0, 1, 1, 1]])
  np.testing.assert_array_equal(got["masked_lm_span_right"], [[4, 4, 4, 6], [1, 5, 5, 5]])
  np.testing.assert_array_equal(got["masked_lm_span_offset"], [[0, 1, 1, 0], [0, 0, 1, 1]])
  np.testing.assert_array_equal(got["masked_lm_span_weights"], [[1, 1, 1, 1], [0, 1, 1, 1]])   # row 1: no s - 1
  assert all(v.dtype == np.int32 and v.shape == (2, 4) for k, v in got.items() if k != "masked_lm_span_weights")
  edges = np.zeros((2, 10), bool)
  edges[:, 0] = True   # [CLS]: the release leaves out a span that starts right after it
  at_cls = masking.span_boundaries(out["masked_lm_positions"], out["masked_lm_weights"], input_mask, 1, edges)
  np.testing.assert_array_equal(at_cls["masked_lm_span_weights"], [[0, 0, 0, 1], [0, 1, 1, 1]])
  short = masking.gather_predictions(ids, ids, is_masked, 6)   # row 1 fills 5 slots of 6
  last = masking.span_boundaries(short["masked_lm_positions"], short["masked_lm_weights"], input_mask, 9)
  np.testing.assert_array_equal(last["masked_lm_span_right"][0, 4:], [9, 9])   # clipped: no token after 9
  np.testing.assert_array_equal(last["masked_lm_span_weights"][0, 4:], [0, 0])   # so no boundary targets
  assert [v[1, 5] for v in last.values()] == [0, 0, 0, 0]   # padding slot


@pytest.mark.parametrize("scheme", ["span", "ngram", "token"])
def test_span_boundaries_are_the_unmasked_neighbours_of_each_run(scheme):
  ids, mask = _batch(n=256)
  spec = _spec(max_predictions=20, scheme=scheme)
  corrupted, is_masked = masking.mask_batch(ids, mask, _keys(len(ids)), spec)
  out = masking.gather_predictions(corrupted, ids, is_masked, 20)
  edges = np.isin(ids, (CLS, SEP))
  got = masking.span_boundaries(out["masked_lm_positions"], out["masked_lm_weights"], mask, max_offset=10, edges=edges)
  left, right, offset = got["masked_lm_span_left"], got["masked_lm_span_right"], got["masked_lm_span_offset"]
  rows, slots = np.nonzero(out["masked_lm_weights"])
  position = out["masked_lm_positions"][rows, slots]
  l, r = left[rows, slots], right[rows, slots]
  assert (l < position).all() and (position < r).all()
  for boundary in (l, r):   # unmasked real tokens
    assert not is_masked[rows, boundary].any() and (mask[rows, boundary] == 1).all()
  for i, a, b in zip(rows, l, r):   # the whole run between them is masked
    assert is_masked[i, a + 1:b].all()
  np.testing.assert_array_equal(offset[rows, slots], np.minimum(position - l - 1, 10))
  inside = ~edges[rows, l] & ~edges[rows, r]   # the release's boundary targets: no [CLS] or [SEP] beside
  np.testing.assert_array_equal(got["masked_lm_span_weights"][rows, slots], inside)
  assert 0.7 < inside.mean() < 1   # spans beside [CLS] or [SEP] occur
  padding = out["masked_lm_weights"] == 0
  assert not left[padding].any() and not right[padding].any() and not offset[padding].any()
  if scheme != "token":
    assert (r - l - 1 > 1).mean() > 0.3   # multi-token runs occur


def test_random_replacements_from_the_input_are_the_rows_own_tokens():
  """SpanBERT draws its 10% "random" tokens from the corpus' token stream: with pool "input" a replacement is
  one of the row's own candidate tokens (a uniform draw over the vocabulary almost never is)."""
  ids, mask = _batch(n=256)
  ids = np.where((mask == 1) & (ids > 4), 5 + ids % 20, ids).astype(np.int32)   # rows of 20 distinct words
  for pool, own in (("input", 1.0), ("vocab", None)):
    spec = _spec({"random_token_pool": pool}, mask_token_prob=0.0, random_token_prob=1.0, max_predictions=40)
    corrupted, is_masked = masking.mask_batch(ids, mask, _keys(len(ids)), spec)
    in_row = np.array([[corrupted[i, j] in set(ids[i][_candidates(ids, mask, spec)[i]]) for j in range(ids.shape[1])]
                       for i in range(len(ids))])
    share = in_row[is_masked].mean()
    assert share == own if own else share < 0.1, (pool, share)

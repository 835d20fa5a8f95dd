"""Tokenizers: Hugging Face parity, BERT's tricky cases, fast path == reference path, training."""

import functools
import itertools
import json
import os
import random
import subprocess
import sys

import hypothesis
from hypothesis import strategies as st
import numpy as np
import pytest

from bert_jax.data import corpus
from bert_jax.data import sentencepiece_tokenizer
from bert_jax.data import tokenizer as T
from bert_jax.data import wordpiece_text as W
from bert_jax.data import vocab_training as V
from conftest import shared_path

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _vocab(tmp_path, tokens, name="vocab.txt"):
  path = tmp_path / name
  path.write_text("".join(t + "\n" for t in SPECIALS + tokens), encoding="utf-8")
  return path


@pytest.fixture(scope="module")
def minilm():
  tok = T.load_tokenizer(shared_path("minilm", "vocab.txt"))
  tok.encode_batch(["warm up"])  # imports TensorFlow here, not inside a timed or property test
  return tok


def test_hf_reference_ids_both_paths(minilm):
  ref = np.load(shared_path("minilm", "hf_reference.npz"))
  examples = json.loads(str(ref["sentences"]))
  assert len(examples) == 8
  for i, sentences in enumerate(examples):
    ids, segment_ids = minilm.encode_pair(*sentences)  # reference (pure Python) path
    np.testing.assert_array_equal(ids, ref[f"input_ids_{i}"])
    np.testing.assert_array_equal(segment_ids, ref[f"token_type_ids_{i}"])
    assert minilm.convert_ids_to_tokens(ids) == ref[f"tokens_{i}"].tolist()
    # Fast path: every sentence must take it (not fall back), and give the same ids.
    assert all(W.fast_form(s, True) is not None for s in sentences)
    flat, lengths = minilm.encode_batch(sentences)
    without_specials = [t for t in ids if t not in (minilm.cls_id, minilm.sep_id)]
    np.testing.assert_array_equal(flat, without_specials)
    assert lengths.tolist() == [len(minilm.encode(s)) for s in sentences]


def test_special_ids_resolved_once(minilm):
  ids = (minilm.pad_id, minilm.unk_id, minilm.cls_id, minilm.sep_id, minilm.mask_id)
  assert ids == (0, 100, 101, 102, 103)
  np.testing.assert_array_equal(minilm.special_ids, [0, 100, 101, 102, 103])
  table = minilm.word_start_table()
  assert table.shape == (minilm.vocab_size,) and table.dtype == bool
  assert table[minilm.special_ids].all()
  assert not table[minilm.convert_tokens_to_ids(["##ing"])[0]]
  assert table[minilm.convert_tokens_to_ids(["play"])[0]]


def test_bert_basic_tokenizer_cases(tmp_path):
  """The cases of google-research/bert tokenization_test.py, plus accents, controls and CJK."""
  assert W.basic_tokenize(" \tHeLLo!how  \n Are yoU?  ", True) == ["hello", "!", "how", "are", "you", "?"]
  assert W.basic_tokenize(" \tHeLLo!how  \n Are yoU?  ", False) == ["HeLLo", "!", "how", "Are", "yoU", "?"]
  assert W.basic_tokenize("H\u00e9llo", True) == ["hello"]
  assert W.basic_tokenize("H\u00e9llo", False) == ["H\u00e9llo"]
  assert W.basic_tokenize("He\u0301llo", False) == ["H\u00e9llo"]  # NFC, as Hugging Face
  assert W.basic_tokenize("ah\u535a\u63a8zz", True) == ["ah", "\u535a", "\u63a8", "zz"]
  assert W.basic_tokenize("hel\x00lo wor\u200bld\ufffd!", True) == ["hello", "world", "!"]
  assert W.basic_tokenize("a$b^c`d~e", True) == ["a", "$", "b", "^", "c", "`", "d", "~", "e"]
  assert W.basic_tokenize("tab\there\u00a0nbsp\u3000ideo", True) == ["tab", "here", "nbsp", "ideo"]
  assert W.is_control("\u0005") and not W.is_control("\t") and not W.is_control("A")
  assert W.is_whitespace("\u00a0") and not W.is_whitespace("A")
  assert all(W.is_punctuation(c) for c in "-$`.\u00bf") and not W.is_punctuation("A")


def test_wordpiece_greedy_longest_match_and_unk(tmp_path):
  tokens = ["want", "##want", "##ed", "wa", "un", "runn", "##ing", ",", "!", "a", "##a"]
  tok = T.WordPieceTokenizer(_vocab(tmp_path, tokens))
  assert tok.tokenize("") == []
  assert tok.tokenize("UNwant\u00e9d,running") == ["un", "##want", "##ed", ",", "runn", "##ing"]
  assert tok.tokenize("unwantedX running") == ["[UNK]", "runn", "##ing"]
  assert tok.tokenize("a" * 100) == ["a"] + ["##a"] * 99
  assert tok.tokenize("a" * 101 + " want") == ["[UNK]", "want"]  # over 100 characters
  assert tok.decode(tok.encode("unwanted running")) == "unwanted running"
  assert tok.decode(tok.encode("want, running!")) == "want, running!"


def test_cased_vocab(tmp_path):
  path = _vocab(tmp_path, ["Hello", "hello", "H", "##\u00e9", "##llo", "World", "!"])
  cased, uncased = T.WordPieceTokenizer(path, do_lower_case=False), T.WordPieceTokenizer(path)
  assert cased.tokenize("Hello hello World!") == ["Hello", "hello", "World", "!"]
  assert uncased.tokenize("Hello hello World!") == ["hello", "hello", "[UNK]", "!"]
  assert cased.tokenize("H\u00e9llo") == ["H", "##\u00e9", "##llo"]  # accent kept when cased
  assert uncased.tokenize("H\u00e9llo") == ["hello"]


def test_encode_pair_longest_first_truncation(tmp_path):
  tok = T.WordPieceTokenizer(_vocab(tmp_path, list("abcdefghij")))
  ids, segments = tok.encode_pair("a b c d e f g h i j", "a b c d", max_length=10)
  assert tok.convert_ids_to_tokens(ids) == ["[CLS]", "a", "b", "c", "d", "[SEP]", "a", "b", "c", "[SEP]"]
  assert segments == [0] * 6 + [1] * 4
  ids, segments = tok.encode_pair("a b c d e f", max_length=5)
  assert tok.convert_ids_to_tokens(ids) == ["[CLS]", "a", "b", "c", "[SEP]"] and segments == [0] * 5


def _random_texts(n, seed):
  rng = random.Random(seed)
  pools = [range(32, 127)] * 6 + [
      range(0xA0, 0x250), range(0x370, 0x400), range(0x400, 0x530), range(0x600, 0x700),
      range(0xAC00, 0xAC40), range(0x3040, 0x3100), range(0x2000, 0x2070), range(0x2100, 0x2200),
      range(0x1F600, 0x1F610), range(0x300, 0x370), range(0x4E00, 0x4E40), range(0xFF00, 0xFF60),
      range(0xFB00, 0xFB10), range(0x900, 0x980), range(0xE00, 0xE60), [0x130, 0x3A3, 0x1E9E, 0xDF, 0xB5],
      [0, 1, 7, 0x7F, 0x85, 0xAD, 0x200B, 0xFFFD, 0xE000, 0x9, 0xA, 0xA0, 0x3000, 0xF900, 0x20000]]
  texts = []
  for _ in range(n):
    chars = []
    for _ in range(rng.randint(1, 30)):
      chars.append(chr(rng.choice(rng.choice(pools))))
      if rng.random() < 0.3:
        chars.append(" ")
    texts.append("".join(chars))
  thai = "\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22\u0e40\u0e1b\u0e47\u0e19\u0e20\u0e32\u0e29\u0e32"
  return texts + ["a" * 100, "a" * 101, "\u00e9" * 60, "\u00e9" * 101, "\uac00" * 30, "\uac00" * 40,
                  "x" * 99 + "\u00e9", thai * 5, thai * 8, "a\u1160b x\u115f"]   # Hangul fillers


@pytest.mark.parametrize("do_lower_case", [True, False])
def test_fast_path_equals_reference_on_random_unicode(minilm, do_lower_case):
  tok = T.WordPieceTokenizer(minilm.vocab_file, do_lower_case)
  texts = _random_texts(3000, seed=int(do_lower_case))
  ids, lengths = tok.encode_batch(texts)
  expected = [tok.encode(t) for t in texts]
  assert lengths.tolist() == [len(e) for e in expected]
  assert ids.tolist() == list(itertools.chain.from_iterable(expected))
  assert sum(W.fast_form(t, do_lower_case) is not None for t in texts) >= 300  # both paths exercised


@hypothesis.settings(max_examples=150, deadline=None,
                     suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture])
@hypothesis.given(texts=st.lists(st.text(max_size=40), min_size=1, max_size=20), do_lower_case=st.booleans())
def test_fast_path_equals_reference_property(minilm, texts, do_lower_case):
  tok = minilm if do_lower_case else _cased_minilm(minilm.vocab_file)
  ids, lengths = tok.encode_batch(texts)
  assert ids.tolist() == [i for t in texts for i in tok.encode(t)]
  assert lengths.tolist() == [len(tok.encode(t)) for t in texts]


@functools.lru_cache(maxsize=None)
def _cased_minilm(vocab_file):
  return T.WordPieceTokenizer(vocab_file, do_lower_case=False)


def test_load_tokenizer_and_save(tmp_path, minilm):
  saved = minilm.save(str(tmp_path / "out"))
  assert saved.endswith("vocab.txt")
  again = T.load_tokenizer(tmp_path / "out")
  assert isinstance(again, T.WordPieceTokenizer) and again.vocab_size == minilm.vocab_size
  with pytest.raises(FileNotFoundError):
    T.load_tokenizer(tmp_path)
  with pytest.raises(ValueError, match=r"\[MASK\]"):
    no_mask = tmp_path / "nomask.txt"
    no_mask.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nword\n", encoding="utf-8")
    T.WordPieceTokenizer(no_mask)


@pytest.fixture(scope="module")
def play_sentences():
  documents = corpus.read_documents(corpus.SHAKESPEARE)
  return [s for d in itertools.islice(documents, 60) for s in d]


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_train_sentencepiece(tmp_path, play_sentences, model_type):
  model = V.train_sentencepiece(play_sentences, str(tmp_path / "spm"), 400, model_type)
  tok = T.load_tokenizer(tmp_path)
  assert isinstance(tok, sentencepiece_tokenizer.SentencePieceTokenizer) and model.endswith("spm.model")
  assert tok.vocab_size == 400
  assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
  text = "Now, fair Hippolyta, our nuptial hour draws on apace."
  assert tok.decode(tok.encode(text)) == text.lower()
  ids, segments = tok.encode_pair("To be.", "Or not.")
  assert ids[0] == tok.cls_id and ids.count(tok.sep_id) == 2 and segments[-1] == 1
  assert tok.mask_id not in tok.encode("[MASK]")  # control symbols never come from text
  table = tok.word_start_table()
  pieces = tok.convert_ids_to_tokens(range(tok.vocab_size))
  assert table[:5].all() and all(table[i] for i, p in enumerate(pieces) if p.startswith("\u2581"))
  assert not any(table[i] for i, p in enumerate(pieces) if p.isascii() and p.isalpha() and p.islower())
  flat, lengths = tok.encode_batch([text, "To be."])
  assert flat.tolist() == tok.encode(text) + tok.encode("To be.") and lengths.sum() == len(flat)


def test_train_sentencepiece_on_a_sample_is_the_same_in_every_process(tmp_path, play_sentences):
  """Above `input_sentence_size` sentences the sample is drawn with a fixed seed: SentencePiece's own
  sampling gave another vocabulary in every process."""
  (tmp_path / "sentences.txt").write_text("\n".join(play_sentences) + "\n", encoding="utf-8")
  code = ("import sys; from bert_jax.data import vocab_training as V; "
          "V.train_sentencepiece([sys.argv[1]], sys.argv[2], 300, input_sentence_size=400)")
  models = []
  for run in range(2):
    prefix = str(tmp_path / f"run{run}")
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "sentences.txt"), prefix], check=True,
                   env={**os.environ, "PYTHONHASHSEED": str(run)})
    models.append(T.load_tokenizer(prefix + ".model").convert_ids_to_tokens(range(300)))
  assert len(play_sentences) > 400 and models[0] == models[1]
  assert V._reservoir(iter("abcdef"), 0) == list("abcdef") and V._reservoir(iter("ab"), 3) == ["a", "b"]  # pylint: disable=protected-access


def test_train_wordpiece(tmp_path, play_sentences):
  sample = play_sentences[:1500]
  path = V.train_wordpiece(sample, 300, str(tmp_path / "vocab.txt"))
  lines = (tmp_path / "vocab.txt").read_text(encoding="utf-8").splitlines()
  assert lines[:5] == SPECIALS
  assert 250 <= len(lines) <= 300
  tok = T.load_tokenizer(path)
  ids = [i for s in sample for i in tok.encode(s)]
  assert ids.count(tok.unk_id) < 0.01 * len(ids)
  characters = sum(len(w) for s in sample for w in W.basic_tokenize(s, True))
  assert len(ids) < 0.6 * characters  # learned word pieces, not single characters
  assert {"the", "and", "you", "##ing"} <= set(lines)
  with pytest.raises(ValueError, match="vocab_size 60 is below the .*raise --vocab_size"):   # fewer than the alphabet
    V.train_wordpiece(sample, 60, str(tmp_path / "small.txt"))


@pytest.mark.parametrize("model", ["wordpiece", "unigram"])
def test_a_vocabulary_too_small_to_train_is_one_line_and_leaves_nothing(tmp_path, play_sentences, model):
  with pytest.raises(ValueError, match=r"raise --vocab_size"):
    V.train(model, play_sentences[:500], 30, str(tmp_path))
  assert not os.listdir(tmp_path)


def test_a_json_file_that_is_no_bpe_vocabulary_is_a_value_error(tmp_path):
  (tmp_path / "config.json").write_text('{"hidden_size": 8}')
  with pytest.raises(ValueError, match="config.json with .*merges.txt is no byte-level BPE vocabulary"):
    T.load_tokenizer(str(tmp_path / "config.json"))


def test_wordpiece_learner_merges_most_frequent_pairs():
  counts = {"low": 5, "lower": 2, "newest": 6, "widest": 3}  # Sennrich et al. 2016's example
  vocab = V._learn_wordpiece(counts, 100, min_count=2, max_alphabet=1000)
  alphabet = {"l", "n", "w", "##o", "##w", "##e", "##r", "##s", "##t", "##i", "##d"}
  assert vocab[:5] == SPECIALS and set(vocab[5:5 + len(alphabet)]) == alphabet
  first_merges = vocab[5 + len(alphabet):5 + len(alphabet) + 4]
  assert first_merges == ["##es", "##est", "##ow", "low"]  # ties: the smaller pair first
  assert len(vocab) == len(set(vocab)) and "newest" in vocab  # merged while pairs occur twice or more
  assert V._count_words(["Hello, World!! 3.14 caf\u00e9"], True) == {
      "hello": 1, ",": 1, "world": 1, "!": 2, "3": 1, ".": 1, "14": 1, "cafe": 1}


def test_load_tokenizer_from_a_remote_file_system(tmp_path):
  """Paths with a scheme go through tf.io.gfile (here the in-memory file system `ram://`)."""
  import tensorflow as tf
  from bert_jax.data import tokenizer
  vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", "##s"]
  tf.io.gfile.makedirs("ram://bert_jax_vocab")
  with tf.io.gfile.GFile("ram://bert_jax_vocab/vocab.txt", "w") as f:
    f.write("\n".join(vocab) + "\n")
  for path in ("ram://bert_jax_vocab/vocab.txt", "ram://bert_jax_vocab"):
    tok = tokenizer.load_tokenizer(path)
    assert tok.encode("Hello worlds") == [5, 6, 7]
    assert tok.mask_id == 4


@pytest.mark.parametrize("vocab_model", ["wordpiece", "unigram", "byte_bpe"])
def test_preview_word_is_found_in_every_vocabulary_family(tmp_path, play_sentences, vocab_model):
  """The end-of-run fill-mask preview masks a one-token word of each held-out line: a SentencePiece
  piece ("▁king") or a byte-level one ("Ġking") is such a word as WordPiece's "king" is."""
  from bert_jax.tools import fill_mask  # pylint: disable=g-import-not-at-top
  tok = T.load_tokenizer(V.train(vocab_model, play_sentences, 600, str(tmp_path)))
  line = tok.encode(tok.space_prefix + "the king and the queen")
  j = fill_mask.preview_word(tok, line, tok.word_start_table())
  assert j is not None and tok.decode([line[j]]).strip() in ("king", "and", "the", "queen")
  assert fill_mask.preview_word(tok, tok.encode("to"), tok.word_start_table()) is None


def test_preview_context_keeps_to_the_masked_word_s_segment(tmp_path, play_sentences):
  """The preview shows a row's longest segment with a word in it, never a line joined across [SEP]: segment
  A's last words glued to B's first read as one garbled sentence. Padding (None) ends a segment too."""
  from bert_jax.tools import fill_mask  # pylint: disable=g-import-not-at-top
  tok = T.load_tokenizer(V.train("wordpiece", play_sentences, 600, str(tmp_path)))
  a, b, c = tok.encode("to be ."), tok.encode("the king and the queen"), tok.encode("my lord")
  row = [tok.cls_id] + a + [tok.sep_id] + b + [tok.sep_id] + [tok.cls_id] + c + [tok.sep_id] + [None] * 3
  assert fill_mask.segments(tok, row) == [a, b, c]
  context, word = fill_mask.preview_context(tok, row, tok.word_start_table())
  j = context.index(tok.mask_id)
  assert context[:j] + [word] + context[j + 1:] == b
  assert fill_mask.preview_context(tok, [tok.cls_id] + a + [tok.sep_id], tok.word_start_table()) is None


@pytest.mark.parametrize("family", ["albert", "roberta"])
def test_a_preview_line_has_spaces_around_the_mask(family):
  """SentencePiece and byte-level BPE decode a mask against the word before it ("has been[MASK] by")."""
  from bert_jax.tools import fill_mask  # pylint: disable=g-import-not-at-top
  tok = T.load_tokenizer(str(shared_path("families", family)))
  ids = tok.encode(tok.space_prefix + "the court has been told by the judge")
  j = ids.index(tok.encode(tok.space_prefix + "told")[0])
  context = ids[:j] + [tok.mask_id] + ids[j + 1:]
  mask = tok.decode([tok.mask_id])
  assert fill_mask.masked_line(tok, context) == f"the court has been {mask} by the judge"
  assert f"been{mask}" in tok.decode(context)   # what the line showed before


@pytest.mark.parametrize("do_lower_case,strip_accents,expected", [
    (True, None, ["cafe", "malaga", "cafe"]), (True, False, ["café", "málaga", "cafe"]),
    (False, None, ["Café", "Málaga", "Cafe"]), (False, True, ["Cafe", "Malaga", "Cafe"])])
def test_wordpiece_strips_accents_as_hugging_face_s_strip_accents_says(tmp_path, do_lower_case, strip_accents,
                                                                       expected):
  """BertTokenizer's `strip_accents`: None follows do_lower_case; an uncased model that keeps its accents
  (BETO-uncased style) is read and saved with it (it lowercased and stripped them)."""
  words = ["cafe", "café", "malaga", "málaga", "Cafe", "Café", "Malaga", "Málaga"]
  (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words) + "\n")
  if strip_accents is not None:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"strip_accents": strip_accents}))
  tok = T.load_tokenizer(str(tmp_path), do_lower_case)
  text = "Café Málaga Cafe"
  assert tok.tokenize(text) == expected
  ids, _ = tok.encode_batch([text, "Cafe"])   # the fast path gives the same ids, or is not taken
  assert ids.tolist() == tok.encode(text) + tok.encode("Cafe")
  tok.save(str(tmp_path / "saved"))
  assert T.load_tokenizer(str(tmp_path / "saved"), do_lower_case).tokenize(text) == expected

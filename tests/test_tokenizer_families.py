"""RoBERTa's byte-level BPE and ALBERT's SentencePiece: Hugging Face's ids, layouts, training a BPE."""

import itertools
import json
import shutil

import numpy as np
import pytest

from bert_jax.data import bpe
from bert_jax.data import corpus
from bert_jax.data import tokenizer as T
from bert_jax.data import vocab_training as V
from conftest import shared_path

FAMILIES = ("roberta", "albert")


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
  """(name, our tokenizer of its HF directory, its reference.npz)."""
  directory = shared_path("families", request.param)
  return request.param, T.load_tokenizer(directory), np.load(directory / "reference.npz")


def _check_example(tok, ref, name, ids, segment_ids):
  np.testing.assert_array_equal([ids], ref[f"{name}/input_ids"], err_msg=name)
  np.testing.assert_array_equal(ref[f"{name}/attention_mask"], 1, err_msg=name)  # unpadded: all real
  if f"{name}/token_type_ids" in ref:
    np.testing.assert_array_equal([segment_ids], ref[f"{name}/token_type_ids"], err_msg=name)


def test_hugging_face_ids_of_every_text_and_pair(family):
  name, tok, ref = family
  texts, pairs = [str(t) for t in ref["texts"]], [(str(a), str(b)) for a, b in ref["pairs"]]
  assert len(texts) == 8 and len(pairs) == 2
  for i, text in enumerate(texts):
    _check_example(tok, ref, f"text{i}", *tok.encode_pair(text))
  for i, (a, b) in enumerate(pairs):
    _check_example(tok, ref, f"pair{i}", *tok.encode_pair(a, b))
  flat, lengths = tok.encode_batch(texts)  # the batch path gives the same ids
  assert flat.tolist() == [i for t in texts for i in tok.encode(t)] and lengths.sum() == len(flat)
  # `padded_texts`: the first three texts, right-padded with the pad id.
  want = ref["padded_texts/input_ids"]
  rows = [tok.encode_pair(t) for t in texts[:len(want)]]
  ids = np.full(want.shape, tok.pad_id)
  mask, segments = np.zeros_like(ids), np.zeros_like(ids)
  for row, (row_ids, row_segments) in enumerate(rows):
    ids[row, :len(row_ids)], mask[row, :len(row_ids)], segments[row, :len(row_ids)] = row_ids, 1, row_segments
  np.testing.assert_array_equal(ids, want)
  np.testing.assert_array_equal(mask, ref["padded_texts/attention_mask"])
  if "padded_texts/token_type_ids" in ref:
    np.testing.assert_array_equal(segments, ref["padded_texts/token_type_ids"])
  assert tok.kind == {"roberta": "byte_bpe", "albert": "sentencepiece"}[name]


@pytest.fixture(scope="module")
def roberta():
  return T.load_tokenizer(shared_path("families", "roberta"))


def test_roberta_specials_and_pair_layout(roberta):
  assert isinstance(roberta, bpe.ByteLevelBPETokenizer) and roberta.vocab_size == 4000
  assert (roberta.cls_id, roberta.pad_id, roberta.sep_id, roberta.unk_id, roberta.mask_id) == (0, 1, 2, 3, 4)
  a, b = roberta.encode("First part."), roberta.encode("Second part, longer than the first.")
  ids, segments = roberta.encode_pair("First part.", "Second part, longer than the first.")
  assert ids == [0] + a + [2, 2] + b + [2] and segments == [0] * len(ids)  # <s> A </s></s> B </s>
  ids, segments = roberta.encode_pair("First part.", "Second part, longer than the first.", max_length=12)
  assert len(ids) == 12 and ids[:len(a) + 3] == [0] + a + [2, 2] and ids[-1] == 2  # B truncated first
  assert roberta.encode_pair("First part.", max_length=4)[0] == [0] + a[:2] + [2]
  # Special tokens spelled in a text stay bytes, as WordPiece and SentencePiece here.
  assert not set(roberta.encode("a <mask> b </s>")) & set(roberta.special_ids.tolist())


def test_roberta_decode_round_trip(roberta):
  ref = np.load(shared_path("families", "roberta", "reference.npz"))
  for text in (str(t) for t in ref["texts"]):  # accents, emoji, double and leading spaces
    assert roberta.decode(roberta.encode(text)) == text
    assert roberta.decode(roberta.encode_pair(text)[0], skip_special_tokens=True) == text
  assert roberta.decode(roberta.encode_pair("A b.", " C d.")[0]) == "<s>A b.</s></s> C d.</s>"
  assert roberta.convert_tokens_to_ids(roberta.convert_ids_to_tokens(range(50))) == list(range(50))


def test_roberta_word_starts(roberta):
  table = roberta.word_start_table()
  assert table.shape == (roberta.vocab_size,) and table[roberta.special_ids].all()
  tokens = roberta.tokenize("Pence read the tally 51-50")
  assert tokens[:3] == ["P", "ence", "Ġread"]
  starts = table[roberta.convert_tokens_to_ids(tokens)].tolist()
  assert starts[1:4] == [False, True, True] and table[roberta.convert_tokens_to_ids(["-"])[0]]


def test_albert_preprocessing_as_albert_tokenizer():
  """AlbertTokenizer's tokens (transformers 4.57) on its special cases."""
  tok = T.load_tokenizer(shared_path("families", "albert"))
  assert (tok.do_lower_case, tok.keep_accents, tok.remove_space) == (True, False, True)
  assert tok.tokenize("In 2016, the") == ["▁in", "▁2016", ",", "▁the"]  # the model has "▁2016,"
  assert tok.tokenize("x2016, y") == ["▁", "x", "2016", ",", "▁", "y"]
  assert tok.tokenize("``Hi'' there") == ["▁\"", "hi", "\"", "▁there"]
  assert tok.tokenize("Café Ünïcödé") == ["▁ca", "fe", "▁un", "ic", "o", "de"]
  assert tok.encode_pair("  a \t b  ")[0] == [2, 10, 12, 78, 3]
  assert tok.encode("In 2016, the") == tok.convert_tokens_to_ids(tok.tokenize("In 2016, the"))


def test_sentencepiece_word_starts_are_albert_s():
  """google-research/albert's `_is_start_piece_sp`: punctuation, digits and other scripts start a word of
  their own (n-gram and whole-word masking take them alone), as "▁" pieces do."""
  tok = T.load_tokenizer(shared_path("families", "albert"))
  tokens = tok.tokenize("in 1990, the U.S. (mostly). naïve <b>")
  assert tokens == ["▁in", "▁1990", ",", "▁the", "▁", "u", ".", "s", ".", "▁(", "most", "ly", ")", ".", "▁", "na",
                    "ive", "▁", "<", "b", ">"]
  table = tok.word_start_table()
  assert [t for t, i in zip(tokens, tok.convert_tokens_to_ids(tokens)) if not table[i]] == [
      "u", "s", "most", "ly", "na", "ive", "b"]


def test_sentencepiece_accents_follow_the_config(tmp_path):
  model = shared_path("families", "albert", "spiece.model")
  shutil.copy(model, tmp_path / "spiece.model")
  assert T.load_tokenizer(tmp_path).keep_accents  # our own models: no config, accents as trained
  for config, keep in (({"tokenizer_class": "AlbertTokenizer"}, False), ({"keep_accents": True}, True)):
    (tmp_path / T.TOKENIZER_CONFIG).write_text(json.dumps(config))
    tok = T.load_tokenizer(tmp_path)
    assert tok.keep_accents is keep and ("é" in "".join(tok.tokenize("café"))) is keep


def test_a_saved_sentencepiece_tokenizer_tokenizes_as_its_original(tmp_path):
  """`save` writes keep_accents and remove_space beside the model (`prepare`'s workers load the copy): an
  ALBERT model's copy drops accents as the original does."""
  tok = T.load_tokenizer(shared_path("families", "albert"))
  (tmp_path / T.TOKENIZER_CONFIG).write_text(json.dumps({"model_max_length": 512}))
  tok.save(str(tmp_path))
  copy = T.load_tokenizer(tmp_path)
  assert (copy.keep_accents, copy.remove_space) == (False, True)
  assert copy.tokenize("Café naïve") == tok.tokenize("Café naïve") == ["▁ca", "fe", "▁", "na", "ive"]
  assert json.loads((tmp_path / T.TOKENIZER_CONFIG).read_text())["model_max_length"] == 512


@pytest.fixture(scope="module")
def play_sentences():
  return [s for d in itertools.islice(corpus.read_documents(corpus.SHAKESPEARE), 40) for s in d]


def test_train_byte_level_bpe_and_load_it(tmp_path, play_sentences):
  path = V.train("byte_bpe", play_sentences, 400, str(tmp_path))
  assert path == str(tmp_path / "vocab.json") and sorted(p.name for p in tmp_path.iterdir()) == [
      "merges.txt", "vocab.json"]
  tok = T.load_tokenizer(tmp_path)
  assert isinstance(tok, bpe.ByteLevelBPETokenizer) and 300 < tok.vocab_size <= 400
  assert (tok.cls_id, tok.pad_id, tok.sep_id, tok.unk_id, tok.mask_id) == (0, 1, 2, 3, 4)  # RoBERTa's
  flat, _ = tok.encode_batch(play_sentences)
  assert len(flat) < 0.6 * sum(len(s) for s in play_sentences)  # learned merges, not single bytes
  text = "Now, fair Hippolyta, our nuptial hour draws on apace."
  unseen = "Ünïcödé 😀 and  TABS\there"  # bytes never seen in training: still no <unk>
  assert tok.decode(tok.encode(unseen)) == unseen and tok.unk_id not in tok.encode(unseen)
  flat, lengths = tok.encode_batch([text, unseen])
  assert flat.tolist() == tok.encode(text) + tok.encode(unseen) and lengths.tolist() == [
      len(tok.encode(text)), len(tok.encode(unseen))]
  saved = tok.save(str(tmp_path / "copy"))
  again = T.load_tokenizer(saved)
  assert saved.endswith("vocab.json") and again.encode(text) == tok.encode(text)
  with pytest.raises(ValueError, match="byte_pair"):
    V.train("byte_pair", play_sentences, 400, str(tmp_path))


def test_bpe_settings_survive_save(tmp_path):
  tok = T.load_tokenizer(shared_path("families", "roberta"))
  spaced = bpe.ByteLevelBPETokenizer(tok.vocab_file, add_prefix_space=True)
  assert spaced.encode("Hello") == tok.encode(" Hello") != tok.encode("Hello")
  again = T.load_tokenizer(spaced.save(str(tmp_path)))
  assert again.add_prefix_space and again.encode("Hello") == spaced.encode("Hello")
  assert not (tmp_path / "other").exists() and tok.save(str(tmp_path / "other"))
  assert not (tmp_path / "other" / T.TOKENIZER_CONFIG).exists()  # RoBERTa's defaults need none


def test_load_bpe_from_a_remote_file_system():
  """vocab.json travels with its merges.txt through tf.io.gfile (here `ram://`)."""
  import tensorflow as tf
  source = shared_path("families", "roberta")
  for name in ("vocab.json", "merges.txt"):
    tf.io.gfile.makedirs("ram://bert_jax_bpe")
    tf.io.gfile.copy(str(source / name), f"ram://bert_jax_bpe/{name}", overwrite=True)
  local = T.load_tokenizer(source)
  for path in ("ram://bert_jax_bpe", "ram://bert_jax_bpe/vocab.json"):
    assert T.load_tokenizer(path).encode("Hello there") == local.encode("Hello there")


def test_prepare_trains_a_byte_level_bpe(tmp_path):
  from bert_jax.data import prepare  # pylint: disable=g-import-not-at-top
  out = str(tmp_path / "out")
  stats = prepare.prepare_corpus(corpus.SHAKESPEARE, out, train_vocab_size=400, vocab_model="byte_bpe",
                                 vocab_sample_sentences=3000, num_shards=2, num_workers=1)
  tok = T.load_tokenizer(out)
  assert isinstance(tok, bpe.ByteLevelBPETokenizer) and stats["tokenizer"] == "byte_bpe"
  assert stats["tokenizer_file"] == "vocab.json" and stats["vocab_size"] == tok.vocab_size <= 400
  assert stats["documents"] > 700 and stats["tokens"] > 500_000


def test_the_space_before_a_fill_mask_mask_is_the_masks():
  """Hugging Face's RoBERTa `<mask>` takes the spaces before it (lstrip): `fill_mask.encode` spells no lone
  space token before it, which changed every prediction."""
  from bert_jax.tools import fill_mask  # pylint: disable=g-import-not-at-top
  tokenizer = T.load_tokenizer(str(shared_path("families", "roberta")))
  ids, positions = fill_mask.encode(tokenizer, "Hello <mask>, world", 64)
  assert ids == [tokenizer.cls_id, *tokenizer.encode("Hello"), tokenizer.mask_id, *tokenizer.encode(", world"),
                 tokenizer.sep_id]
  assert positions == [ids.index(tokenizer.mask_id)]

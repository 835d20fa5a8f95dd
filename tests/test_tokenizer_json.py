"""A Hugging Face tokenizer.json read by `load_tokenizer`: Hugging Face's ids, its post-processor's layout."""

import json

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

from bert_jax.data import tokenizer as T
from bert_jax.data import tokenizer_json
from conftest import shared_path


@pytest.fixture(scope="module")
def roberta_json(tmp_path_factory):
  """RoBERTa's vocab.json + merges.txt written as one tokenizer.json, as its fast tokenizer saves it."""
  source = shared_path("families", "roberta")
  tk = Tokenizer(models.BPE.from_file(str(source / "vocab.json"), str(source / "merges.txt")))
  tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tk.decoder = decoders.ByteLevel()
  tk.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0), add_prefix_space=False)
  path = tmp_path_factory.mktemp("roberta_json") / "tokenizer.json"
  tk.save(str(path))
  return path, np.load(source / "reference.npz")


def test_roberta_tokenizer_json_gives_hugging_face_ids(roberta_json):
  path, ref = roberta_json
  for tok in (T.load_tokenizer(path), T.load_tokenizer(path.parent)):   # the file, or its directory
    assert isinstance(tok, tokenizer_json.TokenizerJson) and tok.kind == "tokenizer_json"
    assert (tok.cls_id, tok.pad_id, tok.sep_id, tok.unk_id, tok.mask_id) == (0, 1, 2, 3, 4)
    texts = [str(t) for t in ref["texts"]]
    for i, text in enumerate(texts):
      ids, segments = tok.encode_pair(text)
      np.testing.assert_array_equal([ids], ref[f"text{i}/input_ids"], err_msg=text)
      assert segments == [0] * len(ids)
    for i, (a, b) in enumerate(ref["pairs"]):
      ids, segments = tok.encode_pair(str(a), str(b))
      np.testing.assert_array_equal([ids], ref[f"pair{i}/input_ids"])   # <s> A </s></s> B </s>
      assert segments == [0] * len(ids)
    flat, lengths = tok.encode_batch(texts)
    assert flat.tolist() == [i for t in texts for i in tok.encode(t)] and lengths.sum() == len(flat)
    assert tok.decode(tok.encode(texts[0])) == texts[0]
  # Same ids as the vocab.json + merges.txt path.
  bpe = T.load_tokenizer(shared_path("families", "roberta"))
  assert T.load_tokenizer(path).encode("Pence read the tally 51-50") == bpe.encode("Pence read the tally 51-50")


def test_padding_and_truncation_stored_in_the_file_are_not_applied(roberta_json, tmp_path):
  """A published tokenizer.json may pad and truncate (all-MiniLM-L6-v2's pads to 128): Hugging Face applies
  that only when a call asks, and so never do we."""
  path, _ = roberta_json
  tk = Tokenizer.from_file(str(path))
  tk.enable_padding(length=32, pad_id=1, pad_token="<pad>")
  tk.enable_truncation(max_length=4)
  tk.save(str(tmp_path / "tokenizer.json"))
  text = "Pence read the tally 51-50 to the chamber"
  tok = T.load_tokenizer(tmp_path / "tokenizer.json")
  assert tok.encode(text) == T.load_tokenizer(path).encode(text) and len(tok.encode(text)) > 4
  flat, lengths = tok.encode_batch([text, "hi"])
  assert lengths.tolist() == [len(tok.encode(text)), len(tok.encode("hi"))]


def test_byte_level_word_starts_are_those_of_the_vocab_json_tokenizer(roberta_json):
  """Word starts (whole-word and span masking) judged on the decoded text: a newline starts a word, the
  bytes of one character ("ï" is "Ã" + "¯") do not."""
  path, _ = roberta_json
  ours, bpe = T.load_tokenizer(path), T.load_tokenizer(shared_path("families", "roberta"))
  tokens = bpe.convert_ids_to_tokens(range(bpe.vocab_size))
  starts = lambda tok: [tok._starts_word(t) for t in tokens]  # pylint: disable=protected-access
  assert starts(ours) == starts(bpe)
  assert not ours._starts_word("\u00af") and ours._starts_word("\u010a")  # pylint: disable=protected-access


MODERN_VOCAB = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]


@pytest.fixture(scope="module")
def modern_dir(tmp_path_factory):
  """A small ModernBERT-style directory: byte-level BPE, [CLS] A [SEP] (B [SEP]) by a template,
  special tokens named in the configs, no token types."""
  directory = tmp_path_factory.mktemp("modern")
  alphabet = pre_tokenizers.ByteLevel.alphabet()
  vocab = {t: i for i, t in enumerate(MODERN_VOCAB + sorted(alphabet) + ["Ġt", "he", "Ġthe"])}
  tk = Tokenizer(models.BPE(vocab, [("Ġ", "t"), ("h", "e"), ("Ġt", "he")]))
  tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tk.decoder = decoders.ByteLevel()
  tk.add_special_tokens(MODERN_VOCAB)
  tk.post_processor = processors.TemplateProcessing(
      single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
      special_tokens=[("[CLS]", 1), ("[SEP]", 2)])
  tk.save(str(directory / "tokenizer.json"))
  (directory / "special_tokens_map.json").write_text(json.dumps(
      {"cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", "unk_token": "[UNK]",
       "mask_token": {"content": "[MASK]", "lstrip": True}}))
  (directory / "tokenizer_config.json").write_text(json.dumps(
      {"tokenizer_class": "PreTrainedTokenizerFast", "model_input_names": ["input_ids", "attention_mask"]}))
  return directory, tk


def test_modernbert_style_specials_and_pairs(modern_dir, tmp_path):
  directory, tk = modern_dir
  tok = T.load_tokenizer(directory)
  assert (tok.unk_id, tok.cls_id, tok.sep_id, tok.pad_id, tok.mask_id) == (0, 1, 2, 3, 4)
  assert tok.vocab_size == tk.get_vocab_size() and tok.special_ids.tolist() == [0, 1, 2, 3, 4]
  a, b = tok.encode("the cat"), tok.encode(" the end")
  assert tok.tokenize("the cat")[:2] == ["t", "he"] and tok.tokenize(" the end")[0] == "Ġthe"
  ids, segments = tok.encode_pair("the cat", " the end")
  hf = tk.encode("the cat", " the end")
  assert ids == [1] + a + [2] + b + [2] == hf.ids
  assert segments == [0] * len(ids) and hf.type_ids != segments   # no token types: model_input_names
  assert tok.encode_pair("the cat")[0] == tk.encode("the cat").ids == [1] + a + [2]
  ids, _ = tok.encode_pair("the cat", " the end", max_length=6)   # longest first: 3 tokens left for A and B
  assert ids == [1] + a[:2] + [2] + b[:1] + [2]
  # A text spelling a special token gets its pieces, never the special id.
  assert not set(tok.encode("a [MASK] b [SEP]")) & set(tok.special_ids.tolist())
  assert tok.decode(tok.encode_pair("the cat")[0], skip_special_tokens=True) == "the cat"
  table = tok.word_start_table()
  assert table[tok.convert_tokens_to_ids(["Ġthe", "Ġt", "he"])].tolist() == [True, True, False]
  again = T.load_tokenizer(tok.save(str(tmp_path / "copy")))
  assert again.encode_pair("the cat", " the end") == tok.encode_pair("the cat", " the end")


def test_token_types_follow_the_template_when_the_model_has_them(modern_dir, tmp_path):
  directory, tk = modern_dir
  path = tmp_path / "tokenizer.json"
  path.write_text((directory / "tokenizer.json").read_text())   # no configs: BERT's spellings, token types
  tok = T.load_tokenizer(path)
  ids, segments = tok.encode_pair("the cat", " the end")
  hf = tk.encode("the cat", " the end")
  assert (ids, segments) == (hf.ids, hf.type_ids) and segments[-1] == 1


def test_unsupported_post_processor_is_an_error(modern_dir, tmp_path):
  spec = json.loads((modern_dir[0] / "tokenizer.json").read_text())
  spec["post_processor"] = {"type": "Sequence", "processors": [spec["post_processor"], spec["post_processor"]]}
  (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
  with pytest.raises(ValueError, match="more than one"):
    T.load_tokenizer(tmp_path)

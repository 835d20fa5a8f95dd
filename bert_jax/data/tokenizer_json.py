"""A Hugging Face `tokenizer.json` (ModernBERT's, or any fast tokenizer's) through `tokenizers`.

The file holds the whole pipeline: normaliser, pre-tokeniser, model (BPE, WordPiece, Unigram), decoder and
the post-processor that places the special tokens. Ids are `tokenizers`' own, so Hugging Face's; the layout
of one text and of a pair (`[CLS] A [SEP]`, `[CLS] A [SEP] B [SEP]`, RoBERTa's `<s> A </s></s> B </s>`) and
its token types are read from the post-processor. The five special roles are named by the
tokenizer_config.json / special_tokens_map.json beside the file, else found by their usual spellings.

    tok = load_tokenizer("modernbert/")   # a directory holding tokenizer.json, or the file itself
    ids, segment_ids = tok.encode_pair("A b.", "C d.", max_length=128)
"""

import json
import os

from bert_jax.data import bpe
from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.data.tokenizer import CLS, MASK, PAD, SEP, UNK

TOKENIZER_JSON = "tokenizer.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
_ROLE_KEYS = {CLS: "cls_token", SEP: "sep_token", PAD: "pad_token", UNK: "unk_token", MASK: "mask_token"}
# Spellings tried, in order, when no config names a role (BERT's, then RoBERTa's).
_ALIASES = {CLS: ("[CLS]", "<s>"), SEP: ("[SEP]", "</s>"), PAD: ("[PAD]", "<pad>"), UNK: ("[UNK]", "<unk>"),
            MASK: ("[MASK]", "<mask>")}


class TokenizerJson(bpe.TokenizersPipeline):
  """The tokenizer of a Hugging Face `tokenizer.json`.

  Args:
    path: the tokenizer.json; tokenizer_config.json and special_tokens_map.json beside it name the special
      tokens and (`model_input_names` without "token_type_ids") say the model has no token types.
  """

  kind = "tokenizer_json"
  do_lower_case = False  # lowercasing, if any, is the file's normaliser

  def __init__(self, path: str):
    from tokenizers import Tokenizer  # pylint: disable=g-import-not-at-top

    self.path = str(path)
    self._tk = Tokenizer.from_file(self.path)
    # A published file may carry padding and truncation (e.g. Fixed(128)); Hugging Face's tokenizer applies
    # them only when a call asks. Ours never pads or cuts: the callers lay out and truncate the ids.
    self._tk.no_padding()
    self._tk.no_truncation()
    # Special tokens spelled in a text are not matched (as the other tokenizers here): a corpus that
    # writes "[MASK]" gets its pieces, never a mask or a separator.
    self._tk.encode_special_tokens = True
    self.vocab_size = self._tk.get_vocab_size()
    spec = json.loads(self._tk.to_str())
    config = _configs(os.path.dirname(self.path))
    self._set_specials(self._tk.token_to_id, _roles(config))
    self._single, self._pair = _layouts(spec.get("post_processor"), self._tk.token_to_id)
    self._token_types = "token_type_ids" in config.get("model_input_names", ["token_type_ids"])
    model = spec.get("model") or {}
    self._continuing_prefix = model.get("continuing_subword_prefix") if model.get("type") == "WordPiece" else None
    self._byte_level = "ByteLevel" in json.dumps(spec.get("decoder"))
    self.space_prefix = " " if self._byte_level else ""

  def build_inputs(self, a: list[int], b: list[int] | None = None) -> tuple[list[int], list[int]]:
    """The post-processor's layout around `a` (and `b`): ids and token types (all 0 without token types)."""
    ids, types = [], []
    for piece, type_id in (self._single if b is None else self._pair):
      part = a if piece == "A" else b if piece == "B" else piece
      ids += part
      types += [type_id if self._token_types else 0] * len(part)
    return ids, types

  def _join(self, tokens: list[str]) -> str:
    return self._tk.decode(self.convert_tokens_to_ids(tokens), skip_special_tokens=False)

  def _starts_word(self, token: str) -> bool:
    if self._continuing_prefix is not None:   # WordPiece: "##ing" continues a word
      return not token.startswith(self._continuing_prefix)
    if token[:1] in ("\u0120", "\u2581"):      # byte-level "Ġthe", SentencePiece-style "▁the"
      return True
    # Other tokens start a word when they are punctuation or space, as `bpe.ByteLevelBPETokenizer`: for a
    # byte-level vocabulary, judged on the decoded text ("Ċ" is a newline; "Ã", a character's first byte,
    # decodes to U+FFFD and "¯", a later byte, too: neither starts a word).
    first = self._tk.decoder.decode([token])[:1] if self._byte_level else token[:1]
    return first.isspace() or not (first.isalnum() or first in ("\ufffd", ""))

  @property
  def source_file(self) -> str:
    """The file this tokenizer was read from (tokenizer.json)."""
    return self.path

  def save(self, directory: str) -> str:
    """Copies tokenizer.json (and the configs beside it) into `directory`; returns tokenizer.json's path."""
    source = os.path.dirname(self.path)
    for name in (tokenizer_lib.TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP):
      if os.path.isfile(os.path.join(source, name)):
        tokenizer_lib.copy_into(directory, os.path.join(source, name), name)
    return tokenizer_lib.copy_into(directory, self.path, TOKENIZER_JSON)


def _configs(directory: str) -> dict:
  """tokenizer_config.json over special_tokens_map.json, {} without either."""
  config = {}
  for name in (SPECIAL_TOKENS_MAP, tokenizer_lib.TOKENIZER_CONFIG):
    path = os.path.join(directory, name)
    if os.path.isfile(path):
      with open(path, encoding="utf-8") as f:
        config.update(json.load(f))
  return config


def _roles(config: dict) -> dict:
  """{role: spellings to try}: the config's token for a role, else the usual ones."""
  roles = {}
  for role, key in _ROLE_KEYS.items():
    value = config.get(key)
    value = value.get("content") if isinstance(value, dict) else value
    roles[role] = (str(value),) if value else _ALIASES[role]
  return roles


def _layouts(processor: dict | None, token_id) -> tuple[list, list]:
  """(single, pair) layouts of a post-processor: lists of ("A" | "B" | [special ids], type id)."""
  if processor and processor["type"] == "Sequence":   # e.g. ByteLevel (offsets only) then a template
    placing = [p for p in processor["processors"] if p["type"] != "ByteLevel"]
    if len(placing) > 1:
      raise ValueError(f"tokenizer.json: more than one post-processor places tokens: {placing}")
    processor = placing[0] if placing else None
  if not processor or processor["type"] == "ByteLevel":   # no special tokens added
    return [("A", 0)], [("A", 0), ("B", 1)]
  kind = processor["type"]
  if kind in ("BertProcessing", "RobertaProcessing"):
    cls, sep = [processor["cls"][1]], [processor["sep"][1]]
    if kind == "BertProcessing":
      return [(cls, 0), ("A", 0), (sep, 0)], [(cls, 0), ("A", 0), (sep, 0), ("B", 1), (sep, 1)]
    return [(cls, 0), ("A", 0), (sep, 0)], [(cls, 0), ("A", 0), (sep, 0), (sep, 0), ("B", 0), (sep, 0)]
  if kind != "TemplateProcessing":
    raise ValueError(f"tokenizer.json post-processor {kind!r} not supported")
  specials = processor.get("special_tokens", {})

  def layout(template):
    out = []
    for item in template:
      if "Sequence" in item:
        out.append((item["Sequence"]["id"], item["Sequence"]["type_id"]))
      else:
        name = item["SpecialToken"]["id"]
        ids = specials[name]["ids"] if name in specials else [token_id(name)]
        out.append((list(ids), item["SpecialToken"]["type_id"]))
    return out

  return layout(processor["single"]), layout(processor["pair"])


def load(path: str) -> TokenizerJson:
  """The tokenizer of `path` (a tokenizer.json, or a directory holding one)."""
  return TokenizerJson(os.path.join(path, TOKENIZER_JSON) if os.path.isdir(path) else path)

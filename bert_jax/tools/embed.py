"""`bert-jax embed`: every layer's hidden states for JSON-lines input (feature extraction).

The feature-based use of BERT (Devlin et al. 2019, 5.3; ELMo-style layer mixing), and our parity probe:

  bert-jax embed --checkpoint=DIR --input=in.jsonl --output=out.npz

Each input line is {"text": ..., "text_b": ... (optional)}, tokenized by the checkpoint's own tokenizer
(WordPiece vocab.txt, SentencePiece *.model, byte-level BPE vocab.json + merges.txt), or {"input_ids": [...],
"attention_mask": [...], "token_type_ids": [...]} (mask and types optional: all ones, all zeros). The output
holds, for example i (the i-th line): `hidden_states_{i}` [layers + 1, seq, hidden] (embeddings first, after
any projection to the hidden size), `last_hidden_state_{i}` [seq, hidden], `pooler_output_{i}` [hidden], and
the `input_ids_{i}` / `token_type_ids_{i}` / `attention_mask_{i}` that were fed; seq counts every id given,
masked ones included. A checkpoint that saved no pooler (ELECTRA, DistilBERT, an HF MaskedLM, token or QA
class, a bert_jax ELECTRA run) gets no `pooler_output_{i}`: the pooler that loading makes up is untrained. An
encoder without token types (DistilBERT) gets no `token_type_ids_{i}`: it reads none.
DIR is any checkpoint `checkpoint_loader` reads: a Hugging Face directory (BERT, ALBERT, RoBERTa, ELECTRA
discriminator or generator, DistilBERT), a Google TF checkpoint, a bert_jax pretraining run or a finetuned
workdir.
"""

from typing import NamedTuple

from absl import app
from absl import flags
from absl import logging
import jax
import numpy as np

from bert_jax import checkpoint_loader
from bert_jax import failures
from bert_jax import paths
from bert_jax.finetune import readers
from bert_jax.models import encoder as model

_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "Hugging Face directory, Google TF checkpoint, bert_jax "
                                  "pretraining run or finetuned workdir.")
# `input` and `do_lower_case` are also flags of `bert-jax prepare`. The CLI imports one subcommand
# module only, but a process importing both (the test suite) must not fail on the duplicate name.
_INPUT = flags.DEFINE_string("input", None, "JSON lines with `text` (+`text_b`) or `input_ids` "
                             "(+`attention_mask`, `token_type_ids`).", allow_override=True)
_OUTPUT = flags.DEFINE_string("output", None, "Output .npz file.")
_VOCAB = flags.DEFINE_string("vocab", None, "Tokenizer for text input (vocab.txt, *.model, vocab.json); "
                             "default: the checkpoint's.")
_DO_LOWER_CASE = flags.DEFINE_bool("do_lower_case", True, "Lowercase text input (uncased models); default: "
                                   "the checkpoint's tokenizer_config.json if it says, else True.",
                                   allow_override=True)
_MAX_LENGTH = flags.DEFINE_integer("max_length", None, "Truncate text input (at least 8 tokens: the special "
                                   "tokens and some text); default and at most: what the position table holds "
                                   "(`longest_input`).", lower_bound=8)
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 8, "Examples per forward pass.", lower_bound=1)
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Compute dtype.")

_LENGTH_BUCKET = 16  # pad batches to a multiple of this: few shapes, few compilations


class Example(NamedTuple):
  """One input line as int32 arrays [seq]."""
  input_ids: np.ndarray
  token_type_ids: np.ndarray
  attention_mask: np.ndarray | None = None   # None: every position is real


def longest_input(cfg: model.BertConfig) -> int:
  """The longest input the position table holds (`BertConfig.max_input_length`)."""
  return cfg.max_input_length


def read_examples(lines, tokenizer=None, max_length: int = 512, truncate: bool = False,
                  path: str = "input", cfg: model.BertConfig | None = None) -> list[Example]:
  """JSON lines (of the file `path`, for messages) -> Examples; text needs a tokenizer. `input_ids` longer than
  `max_length` are an error, or with `truncate` cut to their first `max_length` (text is always truncated as
  `encode_pair` does). With the model's `cfg`, an id past its vocabulary or token types is an error too: the
  embedding lookup would give NaN for it, silently."""
  examples = []
  for n, line in enumerate(lines, 1):
    if not line.strip():
      continue
    record = readers.json_row(path, n, line)
    if input_kind(path, n, record) == "input_ids":
      ids = record["input_ids"]
      types = record.get("token_type_ids", [0] * len(ids))
      mask = record.get("attention_mask", [1] * len(ids))
      if len(ids) > max_length and truncate:
        ids, types, mask = ids[:max_length], types[:max_length], mask[:max_length]
      elif len(ids) > max_length:
        raise ValueError(f"{path}, line {n}: {len(ids)} input_ids, more than max_length {max_length}")
    else:
      if tokenizer is None:
        raise ValueError(f"{path}, line {n}: text input needs a vocabulary (--vocab, or the checkpoint's "
                         "vocab.txt, SentencePiece *.model or vocab.json + merges.txt)")
      ids, types = tokenizer.encode_pair(record["text"], record.get("text_b"), max_length=max_length)
      mask = [1] * len(ids)
    for name, values in (("token_type_ids", types), ("attention_mask", mask)):
      if len(values) != len(ids):
        raise ValueError(f"{path}, line {n}: {len(ids)} input_ids but {len(values)} {name}")
    if cfg is not None:
      _check_ids(path, n, ids, types, cfg, from_text="input_ids" not in record)
    examples.append(Example(*(np.asarray(x, np.int32) for x in (ids, types, mask))))
  return examples


def _check_ids(path: str, n: int, ids, types, cfg: model.BertConfig, from_text: bool = False) -> None:
  """A DataError naming line `n` of `path` and the first id outside the model's vocabulary or token types
  (`from_text`: ids the tokenizer gave a `text`/`text_b` line, whose second text the model has no type for)."""
  if from_text and cfg.type_vocab_size == 1 and any(types):
    raise readers.DataError(f"{path}, line {n}: a text_b pair, but the model has one token type: give `text` "
                            "alone")
  for name, values, size, what in (("input_ids", ids, cfg.vocab_size, "ids in its vocabulary"),
                                   ("token_type_ids", types, cfg.type_vocab_size, "token types")):
    if name == "token_type_ids" and not size:   # no token-type embeddings (DistilBERT): the ids are not read
      continue
    outside = [v for v in values if not 0 <= v < size]
    if outside:
      raise readers.DataError(f"{path}, line {n}: {name} holds {outside[0]}, but the model has {size} {what} "
                              f"(0 to {size - 1})")


def input_kind(path: str, n: int, record: dict) -> str:
  """"input_ids" or "text": which input line `n` of the JSON lines file `path` gives; a DataError naming the file
  and the line when it gives neither."""
  for kind in ("input_ids", "text"):
    if kind in record:
      return kind
  raise readers.DataError(f"{path}, line {n}: expected a `text` or an `input_ids` field, got {sorted(record)}")


def padded_batches(cfg: model.BertConfig, examples: list, batch_size: int):
  """Yields (example indices, (input_ids, input_mask, segment_ids) [batch_size, length]) over `examples`
  sorted by length, each padded to a multiple of 16 tokens (few shapes, few compilations); rows past the
  last example are all padding."""
  # Padding takes the pad id, as Hugging Face pads: RoBERTa then gives it the pad position, as there.
  pad_id = 0 if cfg.position_pad_id is None else cfg.position_pad_id
  order = sorted(range(len(examples)), key=lambda i: len(examples[i].input_ids))
  for start in range(0, len(order), batch_size):
    chunk = order[start:start + batch_size]
    length = -(-max(len(examples[i].input_ids) for i in chunk) // _LENGTH_BUCKET) * _LENGTH_BUCKET
    # Never past the position table: an out-of-range position id embeds as NaN, which the attention
    # would spread to the real positions (0 * NaN) however the padding is masked.
    length = min(length, longest_input(cfg))
    ids = np.full((batch_size, length), pad_id, np.int32)
    mask, types = np.zeros_like(ids), np.zeros_like(ids)
    for row, i in enumerate(chunk):
      e = examples[i]
      n = len(e.input_ids)
      ids[row, :n], types[row, :n] = e.input_ids, e.token_type_ids
      mask[row, :n] = 1 if e.attention_mask is None else e.attention_mask
    yield chunk, (ids, mask, types)


def embed_examples(cfg: model.BertConfig, params, examples, batch_size: int = 8, pool: bool | None = None) -> dict:
  """Runs the encoder over examples ((ids, types) or Examples) in length-sorted, padded batches; returns
  the .npz arrays.

  `pool`: whether to write `pooler_output`; None: when the params have a pooler.
  """
  pool = "pooler" in params if pool is None else pool
  encoder = model.BertEncoder(cfg)
  # Params are an argument, not a closure, so they are not folded into the compiled program as constants.
  run = jax.jit(lambda p, ids, mask, types: encoder.apply({"params": p}, ids, mask, types,
                                                          output_hidden_states=True, pool=pool))
  examples = [Example(*e) for e in examples]
  arrays = {}
  for chunk, (ids, mask, types) in padded_batches(cfg, examples, batch_size):
    out = jax.device_get(run(params, ids, mask, types))
    for row, i in enumerate(chunk):
      n = len(examples[i].input_ids)
      arrays[f"hidden_states_{i}"] = out["hidden_states"][:, row, :n].astype(np.float32)
      arrays[f"last_hidden_state_{i}"] = out["sequence_output"][row, :n].astype(np.float32)
      if pool:
        arrays[f"pooler_output_{i}"] = out["pooled_output"][row].astype(np.float32)
      arrays[f"input_ids_{i}"] = ids[row, :n]
      if cfg.type_vocab_size:
        arrays[f"token_type_ids_{i}"] = types[row, :n]
      arrays[f"attention_mask_{i}"] = mask[row, :n]
  return arrays


def _tokenizer():
  """The --vocab tokenizer, else the checkpoint's; None if it has none (input_ids input needs none)."""
  lower = _DO_LOWER_CASE.value if _DO_LOWER_CASE.present else None
  if _VOCAB.value is not None:
    return checkpoint_loader.load_tokenizer(_CHECKPOINT.value, lower, _VOCAB.value)
  try:
    return checkpoint_loader.load_tokenizer(_CHECKPOINT.value, lower)
  except FileNotFoundError:
    return None  # text input, if any, then says it needs a vocabulary


def main(argv) -> None:
  """`bert-jax embed`: reads --input, writes --output (see the module docstring)."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  for flag in (_CHECKPOINT, _INPUT, _OUTPUT):
    if flag.value is None:
      raise app.UsageError(f"--{flag.name} is required")
  # A checkpoint, vocabulary or input that is not there or cannot be read, or an output folder that cannot be
  # made: one paragraph, exit 2.
  with failures.as_user_errors("bert-jax embed", OSError, ValueError):
    output = paths.output_file(_OUTPUT.value, "output", example="embeddings.npz")
    cfg, params = checkpoint_loader.load_model(_CHECKPOINT.value, dtype=_DTYPE.value)
    max_length = min(_MAX_LENGTH.value or longest_input(cfg), longest_input(cfg))
    tokenizer = _tokenizer()
    if _VOCAB.value:
      checkpoint_loader.check_vocab_fits(tokenizer, cfg, _VOCAB.value)
    lines = readers.read_text(_INPUT.value).split("\n")   # not UTF-8: the line and byte, named
    examples = read_examples(lines, tokenizer, max_length, path=_INPUT.value, cfg=cfg)
    if not examples:
      raise ValueError(f"{_INPUT.value} holds no examples (JSON lines with `text` or `input_ids`)")
  pool = "pooler" in params["bert"] and checkpoint_loader.saved_pooler(_CHECKPOINT.value, params)
  arrays = embed_examples(cfg, params["bert"], examples, _BATCH_SIZE.value, pool)
  np.savez(output, **arrays)
  logging.info("wrote %d examples to %s", len(examples), output)

"""`bert-jax fill-mask`: the most likely tokens at each [MASK] of a text, from the pretraining MLM head.

    bert-jax fill-mask --checkpoint=workdir/tiny "the king wears the [MASK] ." --top_k=5
    bert-jax fill-mask --checkpoint=DIR --input=texts.txt --output=predictions.jsonl   # one text a line

The checkpoint is any that `checkpoint_loader` reads and that kept its MLM head: a bert_jax pretraining
run, a Hugging Face BertForPreTraining / BertForMaskedLM directory (`cls.predictions.*`), or a Google TF
checkpoint (`cls/predictions/*`). `predict` is the library call (the pretraining loop's examples use it).
`[MASK]` as typed becomes the mask token, whatever the tokenizer would make of the characters.
"""

import dataclasses
import functools
import itertools
import json
import re

from absl import app
from absl import flags
import jax
import numpy as np

from bert_jax import checkpoint_loader
from bert_jax import failures
from bert_jax import paths
from bert_jax.models import config as model_config
from bert_jax.models import heads
from bert_jax.models import encoder as model
from bert_jax.data import tokenizer as tokenizer_lib

FLAGS = flags.FLAGS
_LENGTH_BUCKET = 16  # pad batches to a multiple of this: few shapes, few compilations


def define_flags() -> None:
  """The command's flags, defined when the CLI runs it: importing `predict` defines none."""
  flags.DEFINE_string("checkpoint", None, "Checkpoint with an MLM head (a bert_jax pretraining run, a Hugging "
                      "Face or a Google TF checkpoint).")
  flags.DEFINE_string("input", None, "Text file, one text with [MASK]s per line (instead of texts as arguments).")
  flags.DEFINE_string("output", None, "Also write the predictions here, one JSON object per text.")
  flags.DEFINE_integer("top_k", 5, "Tokens shown for each [MASK].")
  flags.DEFINE_bool("do_lower_case", None, "Lowercase the text; default: the checkpoint's tokenizer_config.json, "
                    "else True.")
  flags.DEFINE_integer("batch_size", 8, "Texts per forward pass.")
  flags.DEFINE_string("vocab", None, "The tokenizer (vocab.txt, *.model, vocab.json, tokenizer.json, or a directory "
                      "holding one) where the checkpoint has none; default: the checkpoint's.")


def encode(tokenizer, text: str, max_length: int) -> tuple[list[int], list[int]]:
  """(`[CLS] text [SEP]` ids with the mask id where `[MASK]` is typed, the mask positions).

  The tokenizer's own spelling of the mask token (`<mask>` in some SentencePiece models: what its
  `decode` writes) is a mask too. The spaces before a mask are the mask's, as Hugging Face's `<mask>`
  (lstrip) takes them: a byte-level BPE would otherwise spell a lone space token before it.
  """
  spellings = {tokenizer_lib.MASK, *tokenizer.convert_ids_to_tokens([tokenizer.mask_id])}
  pieces = re.split("|".join(re.escape(s) for s in sorted(spellings)), text)
  if len(pieces) == 1:
    raise ValueError(f"no {tokenizer_lib.MASK} in {text!r}")
  ids, positions = [tokenizer.cls_id], []
  for i, piece in enumerate(pieces):
    if i:
      positions.append(len(ids))
      ids.append(tokenizer.mask_id)
    ids += tokenizer.encode(piece.rstrip() if i + 1 < len(pieces) else piece)
  ids.append(tokenizer.sep_id)
  if len(ids) > max_length:
    raise ValueError(f"{len(ids)} tokens, more than the model's {max_length} positions: {text!r}")
  return ids, positions


@functools.cache
def _top_k_fn(cfg: model.BertConfig, top_k: int, vocab_size: int):
  """Jitted (params, batch) -> (probabilities, token ids), each [B, P, top_k], best first.

  Only the tokenizer's `vocab_size` ids are candidates: a model's table may be padded past it.
  """
  def top(params, batch):
    # The MLM head at `masked_lm_positions`; the pooler only where the encoder was saved with one.
    mlm = heads.BertForPreTraining(cfg, use_nsp=False, pool="pooler" in params["bert"])
    logits = mlm.apply({"params": params}, batch)["mlm_logits"]   # [B, P, V] float32
    probs = jax.nn.softmax(logits, axis=-1)   # float32 on purpose, over the model's whole vocabulary
    return jax.lax.top_k(probs[..., :vocab_size], top_k)
  return jax.jit(top)


def predict(model_config: model.BertConfig, params: dict, tokenizer, texts, top_k: int = 5,
            batch_size: int = 8) -> list[list[list[tuple[str, float]]]]:
  """The `top_k` most likely tokens at each `[MASK]` of each text.

  Args:
    model_config: the model's config (its `scan_layers` must match the params' layout).
    params: the pretraining params {"bert": ..., "mlm": ...} (other heads are ignored).
    tokenizer: the checkpoint's tokenizer.
    texts: strings, each with at least one `[MASK]`.
    top_k: tokens per mask.
    batch_size: texts per forward pass.
  Returns:
    Per text, per mask (in order), [(token, probability), ...] most likely first.
  """
  if "mlm" not in params:
    raise ValueError(f"the checkpoint has no MLM head (its params hold {sorted(params)}, no 'mlm'): fill-mask "
                     "needs one saved with its pretraining heads (HF BertForPreTraining / BertForMaskedLM)")
  if model_config.causal:
    raise ValueError("the checkpoint is a left-to-right (causal) language model: its head predicts the next token "
                     "and its output at a [MASK] has not read the words after it, so it fills no mask; fill-mask "
                     "needs a masked language model")
  texts = list(texts)
  encoded = [encode(tokenizer, t, model_config.max_input_length) for t in texts]
  run = _top_k_fn(model_config, top_k, min(tokenizer.vocab_size, model_config.vocab_size))
  mlm_params = {"bert": params["bert"], "mlm": params["mlm"]}
  num_masks = max((len(p) for _, p in encoded), default=0)   # one shape of positions per call
  order = sorted(range(len(texts)), key=lambda i: len(encoded[i][0]))
  results = [None] * len(texts)
  for start in range(0, len(order), batch_size):
    chunk = order[start:start + batch_size]
    length = -(-max(len(encoded[i][0]) for i in chunk) // _LENGTH_BUCKET) * _LENGTH_BUCKET
    length = min(length, model_config.max_input_length)   # never past the position table
    ids, mask = np.zeros((batch_size, length), np.int32), np.zeros((batch_size, length), np.int32)
    positions = np.zeros((batch_size, num_masks), np.int32)
    for row, i in enumerate(chunk):
      n = len(encoded[i][0])
      ids[row, :n], mask[row, :n] = encoded[i][0], 1
      positions[row, :len(encoded[i][1])] = encoded[i][1]
    batch = {"input_ids": ids, "input_mask": mask, "segment_ids": np.zeros_like(ids),
             "masked_lm_positions": positions}
    probs, token_ids = jax.device_get(run(mlm_params, batch))
    for row, i in enumerate(chunk):
      results[i] = [list(zip(spelled(tokenizer, token_ids[row, m]), probs[row, m].tolist()))
                    for m in range(len(encoded[i][1]))]
  return results


def spelled(tokenizer, ids) -> list[str]:
  """Each token as text, as the tokenizer decodes it alone: a byte-level BPE's " you" for "Ġyou", SentencePiece's
  "you" for "▁you"; WordPiece keeps a word's later piece as "##ing", which says it is one."""
  return [tokenizer.decode([i]) for i in ids]


def format_predictions(texts, predictions) -> str:
  """The predictions for people: each text, then a line per [MASK] with its tokens and probabilities."""
  lines = []
  for text, masks in zip(texts, predictions):
    lines.append(text)
    for m, candidates in enumerate(masks, 1):
      shown = "  ".join(f"{token} {prob:.3f}" for token, prob in candidates)
      lines.append(f"  {tokenizer_lib.MASK} {m}: {shown}")
  return "\n".join(lines)


def _read_texts(argv) -> list[str]:
  if FLAGS.input is not None and len(argv) > 1:
    raise app.UsageError("give texts as arguments or --input, not both")
  if FLAGS.input is None:
    if len(argv) < 2:
      raise app.UsageError('give texts with [MASK] as arguments ("the [MASK] sat .") or --input=FILE')
    return argv[1:]
  with open(FLAGS.input, encoding="utf-8") as f:
    texts = [line.rstrip("\n") for line in f if line.strip()]
  if not texts:
    raise failures.UserError(f"{FLAGS.input} holds no texts (a line each, with [MASK] where a word goes)")
  return texts


def held_out_examples(cfg: model.BertConfig, params, tokenizer, eval_iter, eval_start, count: int) -> str:
  """`count` held-out lines with one word masked: the word and the model's top 5 (the pretraining loop's
  preview at its end).

  The word is the middle single-piece word of a segment of each row of the first held-out batch (its longest
  that has one: a sentence pair's A or B, or one example of a packed row), shown with up to 12 tokens of
  context either side from that segment alone (`preview_context`); the lines are the same at every call.
  """
  eval_iter.set_state(eval_start)
  batch = next(iter(eval_iter))
  ids = np.array(batch["input_ids"])
  rows, slots = np.nonzero(batch["masked_lm_weights"])   # the masking of eval batches, undone
  ids[rows, batch["masked_lm_positions"][rows, slots]] = batch["masked_lm_ids"][rows, slots]
  starts = tokenizer.word_start_table()
  texts, shown, words = [], [], []
  for row, mask in zip(ids, batch["input_mask"]):
    found = preview_context(tokenizer, [int(t) if m else None for t, m in zip(row, mask)], starts)
    if found is not None and len(texts) < count:
      context, word = found
      texts.append(tokenizer.decode(context))
      shown.append(masked_line(tokenizer, context))
      words.append(tokenizer.decode([word]).strip())
  # On the host, as a loaded checkpoint computes: the run's compute switches back at their defaults (a kernel
  # such as splash takes only some lengths, a sharded decoder a mesh).
  cfg = dataclasses.replace(cfg, **{f: getattr(model_config.BertConfig(), f) for f in model_config.COMPUTE_FIELDS})
  predictions = predict(cfg, jax.device_get(params), tokenizer, texts, top_k=5)
  lines = []
  for text, word, (candidates,) in zip(shown, words, predictions):
    top = "  ".join(f"{token} {prob:.2f}" for token, prob in candidates)
    lines += [f"  {text}", f"    masked: {word!r}; top 5: {top}"]
  return "\n".join(lines)


def masked_line(tokenizer, context: list[int]) -> str:
  """`context` (ids with one mask id) as a line to print, with spaces around the mask: SentencePiece and
  byte-level BPE decode it against the word before (the masked word's own "▁" or "Ġ" went with it)."""
  at = context.index(tokenizer.mask_id)
  parts = (tokenizer.decode(context[:at]).strip(), tokenizer.decode([tokenizer.mask_id]),
           tokenizer.decode(context[at + 1:]).strip())
  return " ".join(p for p in parts if p)


def segments(tokenizer, row: list) -> list[list[int]]:
  """The runs of `row`'s tokens between its special tokens ([CLS], [SEP], padding as None): the segments of
  a sentence pair or of the examples packed in a row, which the preview must not join into one line."""
  special = {tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id, None}
  return [list(run) for is_special, run in itertools.groupby(row, special.__contains__) if not is_special]


def preview_context(tokenizer, row: list, starts: np.ndarray) -> tuple[list[int], int] | None:
  """(context with [MASK] for the word, the word's id) for one row of ids (None where padded), or None where
  no segment has a word to mask (`preview_word`): the longest such segment, up to 12 tokens either side of
  the word in it, cut at whole words."""
  for line in sorted(segments(tokenizer, row), key=len, reverse=True):
    j = preview_word(tokenizer, line, starts)
    if j is None:
      continue
    lo, hi = max(0, j - 12), min(len(line), j + 13)   # a line's worth around it, in whole words
    while lo < j and not starts[line[lo]]:
      lo += 1
    while hi < len(line) and hi > j + 1 and not starts[line[hi]]:
      hi -= 1
    return line[lo:j] + [tokenizer.mask_id] + line[j + 1:hi], line[j]
  return None


def preview_word(tokenizer, line: list[int], starts: np.ndarray) -> int | None:
  """The middle one-token word of `line` (three letters or more) to mask in a preview; None if it has none.

  A token's word is its decoded text, without the tokenizer's word-start mark ("▁", "Ġ"), so that every
  vocabulary family is judged alike.
  """
  single = [j for j, t in enumerate(line) if starts[t] and (j + 1 == len(line) or starts[line[j + 1]])]
  single = [j for j in single if len(w := tokenizer.decode([line[j]]).strip()) > 2 and w.isalpha()]
  return single[len(single) // 2] if single else None


def main(argv) -> None:
  """`bert-jax fill-mask`: prints the predictions (see the module docstring)."""
  if FLAGS.checkpoint is None:
    raise app.UsageError("--checkpoint is required")
  # A checkpoint, text or output folder that cannot be used: say why, briefly.
  with failures.as_user_errors("bert-jax fill-mask", ValueError, OSError):
    texts = _read_texts(argv)
    output = paths.output_file(FLAGS.output, "output") if FLAGS.output is not None else None
    cfg, params, tokenizer = checkpoint_loader.load(FLAGS.checkpoint, do_lower_case=FLAGS.do_lower_case,
                                                    vocab=FLAGS.vocab)
    predictions = predict(cfg, params, tokenizer, texts, FLAGS.top_k, FLAGS.batch_size)
  print(format_predictions(texts, predictions))
  if output is not None:
    with open(output, "w", encoding="utf-8") as f:
      for text, masks in zip(texts, predictions):
        record = {"text": text, "masks": [[{"token": t, "prob": p} for t, p in c] for c in masks]}
        f.write(json.dumps(record) + "\n")

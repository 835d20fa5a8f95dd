"""`bert-jax analyze heads`: what every attention head looks at, averaged over a corpus.

    bert-jax analyze heads --checkpoint=path/to/minilm \
        --input=news_articles.jsonl --output_dir=heads/ --max_examples=1000

Input: JSON lines with a text field (`--text_key`), or plain text whose documents are separated by blank
lines. Documents are split into sentences (after . ! ? followed by a capital, digit or quote). By default
consecutive sentences make BERT pretraining inputs `[CLS] A [SEP] B [SEP]` of up to `--max_length` tokens,
A and B about half each: the segments of text Clark et al. (2019, 2) fed BERT. With `--sentences` each
sentence is one input `[CLS] s [SEP]`. The checkpoint's tokenizer writes the layout (RoBERTa's <s> A </s></s>
B </s>), and its cls/sep ids say which tokens are [CLS] and [SEP].

Per head, averaged over every real query token of every input (sums and counts accumulated on the device
over batches, fetched once):
  attn_cls, attn_sep, attn_punct   mean attention to [CLS], [SEP], "." or "," (Clark et al. Fig. 2)
  attn_prev, attn_next             mean attention to the previous / next token (Clark et al. 3.1)
  entropy                          mean entropy of a query's attention, nats (Clark et al. Fig. 4)
  entropy_cls                      the same from the [CLS] query only (Clark et al. 3.3)
  entropy_of_mean                  entropy of the attention averaged over an input's queries, per input
  confidence                       mean of the largest attention weight (Voita et al. 2019, 4.1)
  argmax_prev, argmax_next         share of queries whose largest weight is on the previous / next token,
                                   among the queries that have one
  argmax_rare                      share of queries whose largest weight is on the input's least frequent
                                   token (Voita et al. 5.3), counted over eligible inputs (below)
Labels (Voita et al. 5): *positional* -1 or +1 when argmax_prev or argmax_next is at least 0.9 ("points
to a specific relative position in at least 90% of the cases"); *rare_token* when argmax_rare is at least
0.5. The paper gives no threshold for the rare-token head (theirs pointed at the rarest token in 66% of
cases); 0.5 is ours. Token frequencies are counted over the analysed inputs, special tokens excluded; an
input is eligible when one token type alone has its lowest count and that type is not among the corpus's
500 most frequent (the paper's filter).
Layers and heads are numbered from 0. Outputs in --output_dir: heads.csv (a row per head), heads_<stat>.png
(layers x heads heat maps, matplotlib permitting) and summary.json.
"""

import csv
import io
import json
import os
import re
import time

from absl import app
from absl import flags
from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import checkpoint_loader
from bert_jax import failures
from bert_jax import paths
from bert_jax.finetune import readers
from bert_jax.models import encoder as model
from bert_jax.tools import embed

POSITIONAL_SHARE = 0.9  # Voita et al. 2019, 5.1
RARE_SHARE = 0.5        # ours: the paper reports 66% for its rare-token head and states no threshold
COMMON_TOKENS = 500     # Voita et al. 5.3: inputs whose rarest token is among the 500 most frequent do not count
STATS = ("attn_cls", "attn_sep", "attn_punct", "attn_prev", "attn_next", "entropy", "entropy_cls",
         "entropy_of_mean", "confidence", "argmax_prev", "argmax_next", "argmax_rare")
# Each statistic's (sum, count) in `batch_sums`.
_RATIOS = {"attn_cls": "queries", "attn_sep": "queries", "attn_punct": "queries", "attn_prev": "queries",
           "attn_next": "queries", "entropy": "queries", "entropy_cls": "cls_queries",
           "entropy_of_mean": "examples", "confidence": "queries", "argmax_prev": "prev_cases",
           "argmax_next": "next_cases", "argmax_rare": "rare_cases"}
_SENTENCE_END = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"'”]))\s+(?=[\"'“(]?[A-Z0-9])")


def define_flags() -> None:
  """The command's flags, defined when the CLI runs it. Names other commands share may be redefined."""
  flags.DEFINE_string("checkpoint", None, "Any checkpoint `checkpoint_loader` reads.", allow_override=True)
  flags.DEFINE_string("input", None, "JSON lines with a text field, or plain text (blank lines between "
                      "documents).", allow_override=True)
  flags.DEFINE_string("output_dir", None, "Where heads.csv, heads_*.png and summary.json go.", allow_override=True)
  flags.DEFINE_integer("max_examples", 1000, "Inputs to analyse, from the start of the file.", allow_override=True,
                       lower_bound=1)
  flags.DEFINE_integer("max_length", 128, "Tokens per input, special tokens included (at least 8: room for "
                       "text beside them).", allow_override=True, lower_bound=8)
  flags.DEFINE_string("text_key", "text", "The text field of JSON lines.", allow_override=True)
  flags.DEFINE_bool("sentences", False, "One sentence per input instead of [CLS] A [SEP] B [SEP] segments.",
                    allow_override=True)
  flags.DEFINE_integer("batch_size", 16, "Inputs per forward pass.", allow_override=True, lower_bound=1)


# ------------------------------------------------------------------------------------------------
# Corpus -> inputs.

def read_documents(lines, text_key: str = "text", path: str = "input") -> list[str]:
  """JSON lines (the `text_key` field of each) or plain text (blank lines between documents); a DataError
  naming the file `path` and the line when a JSON line is not an object with that text."""
  lines = list(lines)
  first = next((line for line in lines if line.strip()), "")
  if first.lstrip().startswith("{"):
    return [readers.json_text(path, n, line, text_key, "--text_key") for n, line in enumerate(lines, 1)
            if line.strip()]
  return [d.strip() for d in re.split(r"\n\s*\n", "".join(lines)) if d.strip()]


def split_sentences(text: str) -> list[str]:
  return [s for s in (s.strip() for s in _SENTENCE_END.split(text)) if s]


def make_inputs(documents, tokenizer, max_length: int, sentences: bool = False,
                max_examples: int | None = None) -> list[embed.Example]:
  """Tokenized model inputs: one per sentence, or consecutive sentences as pairs A, B of about half the
  budget each (truncated longest-first to `max_length`)."""
  budget = max_length - len(tokenizer.build_inputs([], None if sentences else [])[0])
  examples = []
  for doc in documents:
    if max_examples is not None and len(examples) >= max_examples:
      break
    pieces = [ids for ids in map(tokenizer.encode, split_sentences(doc)) if ids]
    while pieces and (max_examples is None or len(examples) < max_examples):
      if sentences:
        a, b = pieces.pop(0)[:budget], None
      else:
        a = _take(pieces, budget // 2)
        b = _take(pieces, budget - len(a)) if pieces else None
        while len(a) + len(b or []) > budget:  # as google-research/bert `_truncate_seq_pair`
          (a if len(a) > len(b or []) else b).pop()
      ids, types = tokenizer.build_inputs(a, b)
      examples.append(embed.Example(np.asarray(ids, np.int32), np.asarray(types, np.int32)))
  return examples


def _take(pieces: list, size: int) -> list:
  """Whole sentences from the front of `pieces` until they hold `size` tokens (at least one sentence)."""
  out = list(pieces.pop(0))
  while pieces and len(out) + len(pieces[0]) <= size:
    out += pieces.pop(0)
  return out


def punctuation_ids(tokenizer) -> list[int]:
  """The ids of "." and "," as the tokenizer writes them after a word (Clark et al.'s punctuation)."""
  ids = set()
  for mark in (".", ","):
    for text in (mark, f"a{mark}"):
      ids.add(tokenizer.encode(text)[-1])
  return sorted(ids)


def key_kinds(tokenizer, examples, common: int = COMMON_TOKENS) -> list[dict]:
  """Per input, bool arrays [S] marking [CLS], [SEP], punctuation and its rarest token, and `rare_valid`
  (everywhere or nowhere): whether the input counts for the rare-token statistic (see the module docstring)."""
  special = set(np.asarray(tokenizer.special_ids).tolist()) | {tokenizer.cls_id, tokenizer.sep_id}
  counts = np.bincount(np.concatenate([e.input_ids for e in examples]))
  counts[[i for i in special if i < len(counts)]] = 0
  frequent = set(np.argsort(-counts, kind="stable")[:common].tolist())
  punct = punctuation_ids(tokenizer)
  kinds = []
  for e in examples:
    ids = e.input_ids
    normal = ~np.isin(ids, list(special))
    lowest = counts[ids[normal]].min() if normal.any() else 0
    rarest = normal & (counts[ids] == lowest)
    valid = normal.any() and len(set(ids[rarest].tolist())) == 1 and int(ids[rarest][0]) not in frequent
    kinds.append({"cls": ids == tokenizer.cls_id, "sep": ids == tokenizer.sep_id, "punct": np.isin(ids, punct),
                  "rarest": rarest, "rare_valid": np.full(len(ids), valid)})
  return kinds


# ------------------------------------------------------------------------------------------------
# Statistics: sums and counts on the device.

def _entropy(p, axis=-1):
  """Entropy in nats; 0 log 0 = 0."""
  return -jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0), axis=axis)


def batch_sums(attn_NBHQK, mask_BL, kinds: dict) -> dict:
  """Sums [num_layers, num_heads] and counts (scalars) of one batch, for `finish` to divide.

  Args:
    attn_NBHQK: attention probabilities [layers, batch, heads, L, L]; rows of padded queries may be anything.
    mask_BL: 1 at real tokens.
    kinds: "cls", "sep", "punct", "rarest", "rare_valid" [B, L] bool (`key_kinds`, padded).
  """
  a = attn_NBHQK.astype(jnp.float32)
  q = mask_BL.astype(jnp.float32)            # [B, L]
  q_BQ = q[None, :, None, :]                 # broadcasts against [N, B, H, Q]
  length_B1 = jnp.maximum(q.sum(1, keepdims=True), 1.0)
  sum_q = lambda x_NBHQ: jnp.sum(x_NBHQ * q_BQ, axis=(1, 3))
  to_kind = lambda name: jnp.einsum("nbhqk,bk->nbhq", a, kinds[name].astype(jnp.float32))
  is_cls = kinds["cls"].astype(jnp.float32) * q
  entropy_NBHQ = _entropy(a)
  mean_NBHK = jnp.einsum("nbhqk,bq->nbhk", a, q) / length_B1[None, :, :, None]
  # Where each query's largest weight lands; a row of zeros (a pruned head) lands nowhere.
  top_NBHQ = jnp.argmax(a, axis=-1)
  live_NBHQ = (a.max(-1) > 0).astype(jnp.float32)
  offset_NBHQ = top_NBHQ - jnp.arange(a.shape[-1])
  has_prev = q * jnp.pad(q[:, :-1], ((0, 0), (1, 0)))
  has_next = q * jnp.pad(q[:, 1:], ((0, 0), (0, 1)))
  rare_q = q * kinds["rare_valid"].astype(jnp.float32)
  on_rare = kinds["rarest"].astype(jnp.float32)[jnp.arange(a.shape[1])[None, :, None, None], top_NBHQ]
  hits = lambda hit_NBHQ, cases_BQ: jnp.einsum("nbhq,bq->nh", hit_NBHQ * live_NBHQ, cases_BQ)
  return {
      "attn_cls": sum_q(to_kind("cls")), "attn_sep": sum_q(to_kind("sep")), "attn_punct": sum_q(to_kind("punct")),
      "attn_prev": sum_q(jnp.pad(jnp.diagonal(a, -1, 3, 4), ((0, 0),) * 3 + ((1, 0),))),
      "attn_next": sum_q(jnp.pad(jnp.diagonal(a, 1, 3, 4), ((0, 0),) * 3 + ((0, 1),))),
      "entropy": sum_q(entropy_NBHQ),
      "entropy_cls": jnp.einsum("nbhq,bq->nh", entropy_NBHQ, is_cls),
      "entropy_of_mean": jnp.einsum("nbh,b->nh", _entropy(mean_NBHK), q[:, 0]),
      "confidence": sum_q(a.max(-1)),
      "argmax_prev": hits((offset_NBHQ == -1).astype(jnp.float32), has_prev),
      "argmax_next": hits((offset_NBHQ == 1).astype(jnp.float32), has_next),
      "argmax_rare": hits(on_rare, rare_q),
      "queries": q.sum(), "cls_queries": is_cls.sum(), "examples": q[:, 0].sum(), "prev_cases": has_prev.sum(),
      "next_cases": has_next.sum(), "rare_cases": rare_q.sum(),
      # What argmax_rare would be if the largest weight fell on a random real key: its chance level.
      "rare_chance": jnp.sum(rare_q * kinds["rarest"].sum(1, keepdims=True) / length_B1),
      "uniform_entropy": jnp.sum(q * jnp.log(length_B1)),
  }


def finish(sums: dict) -> dict:
  """Host sums -> {statistic: [num_layers, num_heads]} means (NaN where nothing was counted)."""
  sums = {k: np.asarray(v, np.float64) for k, v in sums.items()}
  with np.errstate(invalid="ignore", divide="ignore"):
    return {name: np.where(sums[count] > 0, sums[name] / sums[count], np.nan) for name, count in _RATIOS.items()}


def labels(stats: dict) -> dict:
  """{"positional": [N, H] int (-1, +1 or 0 for none), "rare_token": [N, H] bool} by the thresholds above."""
  prev, nxt = (np.nan_to_num(stats[k]) for k in ("argmax_prev", "argmax_next"))
  positional = np.where(prev >= POSITIONAL_SHARE, -1, np.where(nxt >= POSITIONAL_SHARE, 1, 0))
  return {"positional": positional, "rare_token": np.nan_to_num(stats["argmax_rare"]) >= RARE_SHARE}


# ------------------------------------------------------------------------------------------------
# The corpus through the encoder.

def _batches(cfg: model.BertConfig, examples, kinds, batch_size: int):
  """`embed.padded_batches` (ids, mask, types), with the inputs' `key_kinds` padded alike."""
  for chunk, (ids, mask, types) in embed.padded_batches(cfg, examples, batch_size):
    kind = {k: np.zeros(ids.shape, bool) for k in kinds[0]}
    for row, i in enumerate(chunk):
      for k, v in kinds[i].items():
        kind[k][row, :len(v)] = v
    yield ids, mask, types, kind


def head_statistics(cfg: model.BertConfig, params, examples, kinds, batch_size: int = 16) -> tuple[dict, dict]:
  """Runs the encoder over `examples`; returns ({statistic: [N, H]}, the host sums and counts)."""
  encoder = model.BertEncoder(cfg)

  @jax.jit
  def sums_of(p, ids, mask, types, kind):  # params an argument: not folded into the program as constants
    out = encoder.apply({"params": p}, ids, mask, types, output_attentions=True, pool=False)
    return batch_sums(out["attentions"], mask, kind)

  add = jax.jit(lambda acc, s: jax.tree.map(jnp.add, acc, s), donate_argnums=0)
  acc = None
  for batch in _batches(cfg, examples, kinds, batch_size):
    s = sums_of(params, *batch)
    acc = s if acc is None else add(acc, s)
  sums = jax.device_get(acc)  # the one fetch
  stats = finish(sums)
  for layer in range(cfg.num_layers):   # a head removed from the weights has no attention: NaN, not 0
    removed = sorted(set(range(cfg.num_heads)) - set(cfg.kept_heads(layer)))
    for values in stats.values():
      values[layer, removed] = np.nan
  return stats, sums


# ------------------------------------------------------------------------------------------------
# Outputs.

def write_csv(path: str, stats: dict, head_labels: dict) -> None:
  num_layers, num_heads = stats[STATS[0]].shape
  with open(path, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["layer", "head", *STATS, "positional", "rare_token"])
    for layer in range(num_layers):
      for head in range(num_heads):
        w.writerow([layer, head, *(f"{stats[s][layer, head]:.4f}" for s in STATS),
                    int(head_labels["positional"][layer, head]), int(head_labels["rare_token"][layer, head])])


def plot_heatmap(path: str, values: np.ndarray, title: str, limits: tuple | None = None) -> bool:
  """A layers x heads heat map with each value written in its cell, colours over `limits` (None: the values'
  range); False without matplotlib."""
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  except ImportError:
    logging.warning("matplotlib is not installed: no %s", path)
    return False
  num_layers, num_heads = values.shape
  fig, ax = plt.subplots(figsize=(1.2 + 0.5 * num_heads, 1.0 + 0.4 * num_layers))
  vmin, vmax = limits or (np.nanmin(values), np.nanmax(values))
  image = ax.imshow(values, cmap="viridis", aspect="auto", vmin=vmin, vmax=vmax)
  mid = (vmin + vmax) / 2
  for (layer, head), v in np.ndenumerate(values):
    ax.text(head, layer, f"{v:.2f}", ha="center", va="center", fontsize=7, color="black" if v > mid else "white")
  ax.set_xticks(range(num_heads))
  ax.set_yticks(range(num_layers))
  ax.set_xlabel("head")
  ax.set_ylabel("layer")
  ax.set_title(title, fontsize=9)
  fig.colorbar(image, ax=ax, fraction=0.03)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return True


def summarize(stats: dict, head_labels: dict, sums: dict) -> dict:
  """The headline numbers: per-layer shares of [SEP]-dominated heads, the labelled heads, the counts."""
  where = lambda m: [(int(i), int(j)) for i, j in zip(*np.nonzero(m))]
  return {
      "inputs": int(sums["examples"]), "query_tokens": int(sums["queries"]),
      "rare_token_cases": int(sums["rare_cases"]),
      "rare_token_chance": round(float(sums["rare_chance"] / max(sums["rare_cases"], 1)), 4),
      "uniform_entropy": float(sums["uniform_entropy"] / sums["queries"]),
      "sep_over_half_per_layer": _share_of_heads(stats["attn_sep"] > 0.5, stats["attn_sep"]),
      "cls_over_half_per_layer": _share_of_heads(stats["attn_cls"] > 0.5, stats["attn_cls"]),
      "positional_heads": [{"layer": i, "head": j, "offset": int(head_labels["positional"][i, j]),
                            "share": round(float(stats["argmax_prev" if head_labels["positional"][i, j] < 0
                                                       else "argmax_next"][i, j]), 4)}
                           for i, j in where(head_labels["positional"] != 0)],
      "rare_token_heads": [{"layer": i, "head": j, "share": round(float(stats["argmax_rare"][i, j]), 4)}
                           for i, j in where(head_labels["rare_token"])],
      "max_argmax_rare": _best(stats["argmax_rare"]),
      "max_argmax_prev": _best(stats["argmax_prev"]), "max_argmax_next": _best(stats["argmax_next"]),
  }


def _share_of_heads(condition: np.ndarray, values: np.ndarray) -> list:
  """Per layer, the share of its heads (those with a statistic: not removed by pruning) where `condition`."""
  live = ~np.isnan(values)
  return [round(float(np.sum(c & l) / np.sum(l)), 4) if np.any(l) else None for c, l in zip(condition, live)]


def _best(values: np.ndarray) -> dict | None:
  if np.all(np.isnan(values)):
    return None
  i, j = np.unravel_index(np.nanargmax(values), values.shape)
  return {"layer": int(i), "head": int(j), "share": round(float(values[i, j]), 4)}


def write_outputs(output_dir: str, stats: dict, sums: dict, extra: dict) -> dict:
  """heads.csv, heads_<stat>.png, summary.json (with `extra` added); returns the summary."""
  os.makedirs(output_dir, exist_ok=True)
  head_labels = labels(stats)
  write_csv(os.path.join(output_dir, "heads.csv"), stats, head_labels)
  for name in STATS:
    # Weights and shares on one scale, 0 to 1, so that maps compare; entropies over their own range.
    plot_heatmap(os.path.join(output_dir, f"heads_{name}.png"), stats[name], name,
                 None if name.startswith("entropy") else (0.0, 1.0))
  summary = {**extra, **summarize(stats, head_labels, sums)}
  with open(os.path.join(output_dir, "summary.json"), "w") as f:
    json.dump(summary, f, indent=1)
  return summary


def main(argv) -> None:
  """`bert-jax analyze heads` (see the module docstring)."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  f = flags.FLAGS
  for name in ("checkpoint", "input", "output_dir"):
    if f[name].value is None:
      raise app.UsageError(f"--{name} is required")
  start = time.time()
  # The checkpoint, the input, an --output_dir that cannot be made: one paragraph, exit 2.
  with failures.as_user_errors("bert-jax analyze heads", OSError, ValueError):
    paths.output_file(os.path.join(f.output_dir, "summary.json"))   # makes the folder, before the work
    cfg, params, tokenizer = checkpoint_loader.load(f.checkpoint)
    documents = read_documents(io.StringIO(readers.read_text(f.input)), f.text_key, f.input)
  max_length = min(f.max_length, embed.longest_input(cfg))
  examples = make_inputs(documents, tokenizer, max_length, f.sentences, f.max_examples)
  if not examples:
    raise readers.DataError(f"{f.input} holds no text to analyse: give JSON lines with a `{f.text_key}` field "
                            "(--text_key names another), or plain text")
  kinds = key_kinds(tokenizer, examples)
  stats, sums = head_statistics(cfg, params["bert"], examples, kinds, f.batch_size)
  extra = {"checkpoint": paths.absolute(f.checkpoint), "input": paths.absolute(f.input),
           "layout": "sentences" if f.sentences else "pairs",
           "max_length": max_length, "seconds": round(time.time() - start, 1)}
  summary = write_outputs(f.output_dir, stats, sums, extra)
  print(json.dumps({k: summary[k] for k in ("inputs", "sep_over_half_per_layer", "positional_heads",
                                            "rare_token_heads", "seconds")}))

"""`bert-jax analyze probe`: what each representation of a frozen encoder holds, read by probing classifiers.

    bert-jax analyze probe --checkpoint=path/to/minilm --task=sentlen,wc,bshift \\
        --corpus=news_articles.jsonl --output_dir=/tmp/probe

Tasks (`--task`, comma separated):
  sentlen, wc, bshift  SentEval-style tasks built from the raw text of `--corpus` (Conneau et al. 2018; see
                       `senteval`), `--max_examples` each.
  tsv:PATH             sentence classification: a TSV/CSV/JSON lines file, or a directory of train/dev/test files,
                       read as the finetuning readers do (`--text_column`, `--label_column`).
  conll:PATH           token tagging: a CoNLL-format file, or a directory of train/dev/test files; the tag is column
                       `--tag_column` (POS 1, chunks 2, NER -1); an example is a sentence, its words the items.
A split a source lacks is carved out of its train split (80/10/10 per class, seeded); each split holds at most
its share (80/10/10) of `--max_examples`.

Features are every representation of the frozen encoder: the embeddings (layer 0) and each layer's output. A
sentence is the mean over its word pieces ([CLS] and [SEP] left out), or its [CLS] vector (`--pool=cls`); a word
is its first word piece (Devlin et al. 2019, 5.3). They are standardised with the train split's mean and std.
Probes: a softmax classifier (`--probe=linear`) or one with a ReLU hidden layer (`--probe=mlp`), trained with
Adam and decoupled weight decay on the kernels, kept at the epoch of best dev loss, stopped after `--patience`
epochs without one; one training run fits every layer (vmap over the layer axis). Beside them, the scalar-mix
probe of Tenney et al. 2019 ("BERT rediscovers the classical NLP pipeline"): softmax weights s_l over all layers
and a scale gamma (`finetune.scalar_mix.ScalarMix`) feed the same classifier; its expected layer is
E[l] = sum_l l * s_l. The mix logits learn 10x faster than the classifier (`probe_fit.fit`'s `mix_rate`): at the
same rate early stopping leaves them near uniform (E[l] near the middle layer whatever the task), with an MLP probe
most.
The majority baseline is the test accuracy of always answering train's most frequent label.

Writes to `--output_dir`: probe.csv (task, layer, train/dev/test accuracy, majority baseline; layer "mix" is
the scalar-mix probe), probe.png (test accuracy per layer of every task, baselines dashed) and summary.json
(per task: the best layer by dev accuracy, the expected layer, the mix weights).
"""

import csv
import functools
import json
import os
import sys
import time
import types

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import checkpoint_loader
from bert_jax import failures
from bert_jax import paths
from bert_jax.analysis import probe_fit
from bert_jax.analysis import senteval
from bert_jax.finetune import ner
from bert_jax.finetune import readers
from bert_jax.models import encoder as model
from bert_jax.tools import embed

FLAGS = flags.FLAGS
_BUCKET = 16  # sequences pad to a multiple of this, read-out rows to a multiple of 8: few shapes to compile


def define_flags() -> None:
  """The command's flags, defined when the CLI runs it: importing `probe` defines none."""
  shared = {"allow_override": True}  # names other analysis commands define too
  flags.DEFINE_string("checkpoint", None, "Any checkpoint `checkpoint_loader` reads (HF directory, run ...).", **shared)
  flags.DEFINE_list("task", None, "sentlen, wc, bshift, tsv:PATH, conll:PATH (comma separated).")
  flags.DEFINE_string("output_dir", None, "Where probe.csv, probe.png and summary.json go.", **shared)
  flags.DEFINE_enum("probe", "linear", ["linear", "mlp"], "Linear softmax classifier, or one ReLU hidden layer.")
  flags.DEFINE_integer("max_examples", 3000, "Examples per task (sentences; tagging: sentences, whose words are "
                       "the items), split 80/10/10.", lower_bound=1, **shared)
  flags.DEFINE_string("corpus", None, "JSON lines (`--text_key`) or plain text for sentlen, wc and bshift.",
                      **shared)
  flags.DEFINE_string("text_key", "text", "The text field of a JSON lines --corpus.", **shared)
  flags.DEFINE_integer("tag_column", -1, "conll: the tag's column (POS 1, chunks 2, NER -1).", **shared)
  flags.DEFINE_string("text_column", "sentence", "tsv: the text column.", **shared)
  flags.DEFINE_string("label_column", "label", "tsv: the label column.", **shared)
  flags.DEFINE_enum("pool", "mean", ["mean", "cls"], "Sentence features: mean of word pieces, or [CLS].")
  flags.DEFINE_integer("hidden_size", 256, "mlp: hidden units.", lower_bound=1)
  flags.DEFINE_integer("batch_size", 64, "Sentences per forward pass of the encoder.", lower_bound=1, **shared)
  flags.DEFINE_integer("max_length", 128, "Word pieces per sentence, [CLS] and [SEP] included (at least 8).",
                       lower_bound=8, **shared)
  flags.DEFINE_float("learning_rate", 3e-3, "Adam learning rate of the probes (above 0).", **shared)
  flags.register_validator("learning_rate", lambda rate: rate > 0, "--learning_rate must be above 0")
  flags.DEFINE_float("weight_decay", 1e-2, "Decoupled weight decay of the probes' kernels.", lower_bound=0.0,
                     **shared)
  flags.DEFINE_integer("max_epochs", 100, "Epochs at most.", lower_bound=1, **shared)
  flags.DEFINE_integer("patience", 8, "Epochs without a better dev loss before training stops.", lower_bound=1,
                       **shared)
  flags.DEFINE_integer("seed", 0, "Seed of the task building, splits and probe initialisation.", lower_bound=0,
                       **shared)


# ---------------------------------------------------------------------------------------------
# Tasks: train/dev/test examples, PairExample (sentences) or NerExample (tagging).


def load_task(name: str, max_examples: int, seed: int, sentences=None, opts=None) -> dict:
  """{"name", "kind": "sentence"|"token", "splits": {split: examples}} of one `--task` entry."""
  if name in senteval.BUILDERS:
    splits = senteval.build(name, sentences, max_examples, seed)
    if not all(splits.values()):
      sizes = ", ".join(f"{s} {len(v)}" for s, v in splits.items())
      raise readers.DataError(f"{name}: too few examples to probe ({sizes}); raise --max_examples or give a "
                              "larger --corpus")
    return {"name": name, "kind": "sentence", "splits": splits}
  kind, _, source = name.partition(":")
  opts = opts or {}
  if kind == "tsv" and source:
    def read(path):
      rows = readers.read_rows(path)
      readers.check_columns(path, rows, {"text_a": opts["text_column"]}, opts["label_column"], True,
                            options={"text_a": "--text_column", "label": "--label_column"})
      return readers.examples_from_rows(rows, opts["text_column"], None, opts["label_column"], path=path)
    locate, label_of = lambda split: readers.resolve_file(source, split, (".tsv", ".csv", ".jsonl")), _label
  elif kind == "conll" and source:
    def read(path):
      return ner.parse_conll(readers.read_text(path).splitlines(), "", opts["tag_column"], path, tag_flag="--tag_column")
    locate, label_of = lambda split: ner.locate(split, source), None
  else:
    raise readers.DataError(f"unknown task {name!r}: give sentlen, wc, bshift, tsv:PATH or conll:PATH")
  rng = np.random.default_rng(seed)
  splits, read_files = {}, set()
  for split in senteval.SPLITS:  # a single file is read once, as train
    path = _located(locate, split)
    if path and path not in read_files:
      splits[split], read_files = read(path), read_files | {path}
  if "train" not in splits:
    raise readers.DataError(f"{source}: no train file (a file, or a directory holding train.*)")
  missing = [s for s in senteval.SPLITS if s not in splits]
  if missing:  # carved out of train; the carved parts of splits that have their own file go back to train
    carved = senteval.split(_sample(splits["train"], max_examples, rng), rng, label_of)
    splits["train"] = [e for s in senteval.SPLITS if s == "train" or s not in missing for e in carved[s]]
    splits.update({s: carved[s] for s in missing})
  caps = dict(zip(senteval.SPLITS, (round(max_examples * f) for f in senteval.SPLIT_FRACTIONS)))
  splits = {s: _sample(splits[s], caps[s], rng) for s in senteval.SPLITS}
  short = os.path.splitext(os.path.basename(os.path.normpath(source)))[0]
  if not all(splits.values()):
    sizes = ", ".join(f"{s} {len(v)}" for s, v in splits.items())
    raise readers.DataError(f"{source}: too few examples to probe ({sizes}); give at least 3, and far more for "
                            "accuracies that say anything")
  return {"name": f"{kind}:{short}", "kind": "sentence" if kind == "tsv" else "token", "splits": splits}


def _label(example):
  return example.label


def _located(locate, split):
  try:
    return locate(split)
  except (FileNotFoundError, readers.DataError):
    return None


def _sample(examples, n, rng):
  """At most n of `examples`, drawn with `rng`, in their order."""
  return examples if len(examples) <= n else [examples[i] for i in sorted(rng.permutation(len(examples))[:n])]


def sentence_inputs(tokenizer, examples, max_length: int, pool: str = "mean"):
  """[(ids [S], read-out [1, S])] and labels: the read-out averages the word pieces, or takes [CLS]."""
  inputs = []
  for e in examples:
    ids, _ = tokenizer.encode_pair(e.text_a, None, max_length=max_length)
    readout = np.zeros([1, len(ids)], np.float32)
    if pool == "cls" or len(ids) <= 2:
      readout[0, 0] = 1.0
    else:
      readout[0, 1:len(ids) - 1] = 1.0 / (len(ids) - 2)
    inputs.append((np.asarray(ids, np.int32), readout))
  return inputs, [e.label for e in examples]


def token_inputs(tokenizer, examples, max_length: int):
  """[(ids [S], read-out [words, S])] and the words' tags: a one-hot row at each word's first word piece (as
  `ner.featurize` places a word's label); words past `max_length` are left out."""
  tags = sorted({t for e in examples for t in e.tags})
  features, meta = ner.featurize_truncated(types.SimpleNamespace(label_names=tags), examples, tokenizer, max_length)
  inputs, labels = [], []
  for row, (e, positions) in enumerate(zip(examples, meta["word_positions"])):
    n = int(features["input_mask"][row].sum())
    kept = [w for w, p in enumerate(positions) if p >= 0]
    readout = np.zeros([len(kept), n], np.float32)
    readout[np.arange(len(kept)), positions[kept]] = 1.0
    inputs.append((features["input_ids"][row, :n], readout))
    labels += [e.tags[w] for w in kept]
  return inputs, labels


def task_inputs(cfg: model.BertConfig, tokenizer, kind: str, examples, max_length: int, pool: str = "mean"):
  """`token_inputs` or `sentence_inputs` of a task's examples, no longer than `cfg`'s position table holds."""
  max_length = min(max_length, embed.longest_input(cfg))
  if kind == "token":
    return token_inputs(tokenizer, examples, max_length)
  return sentence_inputs(tokenizer, examples, max_length, pool)


def encode(cfg: model.BertConfig, params, inputs, batch_size: int = 64) -> np.ndarray:
  """Read-outs of every representation: [num_layers + 1, sum of read-out rows, hidden] float32.

  Args:
    inputs: (ids [S], read-out [K, S]) per sentence; row k of the read-out weighs the S positions of item k.
  """
  run = _read_out(cfg)
  pad_id = 0 if cfg.position_pad_id is None else cfg.position_pad_id
  starts = np.cumsum([0] + [len(r) for _, r in inputs])
  features = np.zeros([cfg.num_layers + 1, starts[-1], cfg.hidden_size], np.float32)
  order = sorted(range(len(inputs)), key=lambda i: len(inputs[i][0]))
  for start in range(0, len(order), batch_size):
    chunk = order[start:start + batch_size]
    length = min(-(-max(len(inputs[i][0]) for i in chunk) // _BUCKET) * _BUCKET, embed.longest_input(cfg))
    rows = -(-max(len(inputs[i][1]) for i in chunk) // 8) * 8
    ids = np.full([batch_size, length], pad_id, np.int32)
    mask = np.zeros_like(ids)
    readout = np.zeros([batch_size, rows, length], np.float32)
    for b, i in enumerate(chunk):
      n, k = len(inputs[i][0]), len(inputs[i][1])
      ids[b, :n], mask[b, :n], readout[b, :k, :n] = inputs[i][0], 1, inputs[i][1]
    out = jax.device_get(run(params, ids, mask, readout))  # one transfer per batch
    for b, i in enumerate(chunk):
      features[:, starts[i]:starts[i + 1]] = out[:, b, :starts[i + 1] - starts[i]]
  return features


@functools.lru_cache(maxsize=4)
def _read_out(cfg: model.BertConfig):
  """The jitted encoder + read-out of `encode`, one per config: every split and task reuses its compilations."""
  encoder = model.BertEncoder(cfg)

  @jax.jit
  def run(p, ids, mask, readout_BKL):
    out = encoder.apply({"params": p}, ids, mask, jnp.zeros_like(ids), output_hidden_states=True, pool=False)
    return jnp.einsum("nblh,bkl->nbkh", out["hidden_states"].astype(jnp.float32), readout_BKL,
                      precision=jax.lax.Precision.HIGHEST)
  return run


# ---------------------------------------------------------------------------------------------
# Outputs.


def write_csv(path: str, results: dict) -> None:
  """probe.csv: one row per task and layer (0 = embeddings), then the task's "mix" row."""
  with open(path, "w", newline="") as f:
    out = csv.writer(f)
    out.writerow(["task", "layer", "train_accuracy", "dev_accuracy", "test_accuracy", "majority_baseline"])
    for task, r in results.items():
      for layer in range(len(r["layers"]["train"])):
        out.writerow([task, layer] + [f"{r['layers'][s][layer]:.4f}" for s in senteval.SPLITS]
                     + [f"{r['majority_baseline']:.4f}"])
      out.writerow([task, "mix"] + [f"{r['mix'][s]:.4f}" for s in senteval.SPLITS] + [f"{r['majority_baseline']:.4f}"])


def summary(results: dict) -> dict:
  """Per task: the best layer by dev accuracy (and its test accuracy), the expected layer, the mix."""
  out = {}
  for task, r in results.items():
    best = int(np.argmax(r["layers"]["dev"]))
    out[task] = {"best_layer": best, "best_layer_test_accuracy": float(r["layers"]["test"][best]),
                 "expected_layer": round(r["expected_layer"], 3), "mix_test_accuracy": r["mix"]["test"],
                 "mix_weights": [round(w, 4) for w in r["mix_weights"]], "mix_gamma": r["mix_gamma"],
                 "majority_baseline": r["majority_baseline"], "num_classes": r["num_classes"],
                 "examples": r["examples"]}
  return out


def plot(path: str, results: dict, title: str = "") -> None:
  """probe.png: test accuracy per layer of each task, its majority baseline dashed in the same colour."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, ax = plt.subplots(figsize=(7, 4.5))
  for k, (task, r) in enumerate(results.items()):
    color = f"C{k}"
    test = r["layers"]["test"]
    ax.plot(range(len(test)), test, "o-", color=color, label=f"{task} (E[l] = {r['expected_layer']:.2f})")
    ax.axhline(r["majority_baseline"], linestyle="--", color=color, alpha=0.7)
  layers = len(next(iter(results.values()))["layers"]["test"])
  ax.set_xticks(range(layers), ["emb"] + [str(i) for i in range(1, layers)])
  ax.set_xlabel("representation (embeddings, then layer)")
  ax.set_ylabel("test accuracy (dashed: majority class)")
  ax.set_ylim(0, 1.02)
  ax.set_title(title)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


# ---------------------------------------------------------------------------------------------
# The command.


def probe_tasks(names) -> dict:
  """{task name: `probe_task` results + the examples per split} of the `--task` entries, as the flags say."""
  started = time.time()
  cfg, params, tokenizer = checkpoint_loader.load(FLAGS.checkpoint)
  sentences = senteval.read_sentences(FLAGS.corpus, FLAGS.text_key) if FLAGS.corpus else None
  opts = {"tag_column": FLAGS.tag_column, "text_column": FLAGS.text_column, "label_column": FLAGS.label_column}
  tasks = [load_task(name, FLAGS.max_examples, FLAGS.seed, sentences, opts) for name in names]  # errors first
  train_opts = {k: FLAGS[k].value for k in ("learning_rate", "weight_decay", "max_epochs", "patience", "seed")}
  results = {}
  for task in tasks:
    x, labels = {}, {}
    for split, examples in task["splits"].items():
      inputs, labels[split] = task_inputs(cfg, tokenizer, task["kind"], examples, FLAGS.max_length, FLAGS.pool)
      x[split] = encode(cfg, params["bert"], inputs, FLAGS.batch_size)
    r = probe_fit.probe_task(x, labels, hidden=FLAGS.hidden_size if FLAGS.probe == "mlp" else 0, **train_opts)
    results[task["name"]] = dict(r, examples={s: len(v) for s, v in labels.items()})
    # Progress on stderr (stdout is the results' JSON), whatever the log verbosity.
    print(f"{task['name']}: test accuracy per layer {[round(float(a), 3) for a in r['layers']['test']]}, mix "
          f"{r['mix']['test']:.3f}, majority {r['majority_baseline']:.3f}, expected layer {r['expected_layer']:.2f} "
          f"({time.time() - started:.0f} s)", file=sys.stderr, flush=True)
  return results


def main(argv) -> None:
  """`bert-jax analyze probe` (see the module docstring)."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  for name in ("checkpoint", "task", "output_dir"):
    if not FLAGS[name].value:
      raise app.UsageError(f"--{name} is required")
  names = FLAGS.task
  if set(names) & set(senteval.BUILDERS) and not FLAGS.corpus:
    raise app.UsageError(f"--corpus is required by {', '.join(sorted(set(names) & set(senteval.BUILDERS)))}")
  started = time.time()
  # The data or a task option (readers.DataError), a file that is not there: no traceback.
  with failures.as_user_errors("bert-jax analyze probe", failures.UserError, OSError):
    paths.output_file(os.path.join(FLAGS.output_dir, "summary.json"))   # makes the folder, before the work
    results = probe_tasks(names)
  write_csv(os.path.join(FLAGS.output_dir, "probe.csv"), results)
  plot(os.path.join(FLAGS.output_dir, "probe.png"), results,
       f"{FLAGS.probe} probes of {os.path.basename(os.path.normpath(FLAGS.checkpoint))}")
  record = {"checkpoint": paths.absolute(FLAGS.checkpoint), "probe": FLAGS.probe, "pool": FLAGS.pool,
            "seconds": round(time.time() - started, 1), "tasks": summary(results)}
  with open(os.path.join(FLAGS.output_dir, "summary.json"), "w") as f:
    json.dump(record, f, indent=2)
  print(json.dumps(record["tasks"], indent=1))

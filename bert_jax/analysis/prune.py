"""`bert-jax analyze prune`: which attention heads a finetuned model needs, and the model without the rest.

    bert-jax analyze prune --checkpoint=/tmp/rt --input=/path/to/rotten_tomatoes/dev.tsv --output_dir=/tmp/rt_prune \
        --export_fraction=0.4 --export_dir=/tmp/rt_pruned

Michel, Levy and Neubig 2019 ("Are Sixteen Heads Really Better than One?"), 4.1: a head's importance is
I_h = E_x |dL(x)/d xi_h| at xi = 1, where xi is the head mask (each head's context vector times its entry
before the output projection) and L the task loss of the true labels; each layer's scores are divided by
their l2 norm (the paper code's default). Here the expectation is over the dev examples one by one (per
example gradients by `jax.vmap`, summed over batches on device); the paper's code sums |.| of each token's
share (its context vector dotted with its gradient) and divides by the token count instead. The heads,
sorted by the normalised score over all layers, are then masked least important first, and the dev metric
(the task's primary one) is measured at every fraction of `--fractions`. The scores are computed once
(`--iterative`: again after every fraction, on the masked model, as the paper's 4.2 does step by step).

Writes to `--output_dir`: prune.csv (fraction, heads_pruned, the metric, the heads masked), prune.png (the
curve), importance.csv (layer, head, score, raw_score) and importance.png (the heat map); `prune_report`
writes the first three. With `--export_dir` the heads masked at `--export_fraction` (the curve's, or the
least important by the first scores if it is not one of `--fractions`) are removed from the weights
(`models.pruning.prune_heads`) and a finetuned workdir written there (`bert-jax predict --checkpoint=DIR2`
loads it); the pruned model's outputs are checked against the masked model's on the dev data, and both forward
passes timed side by side (export.json). Classification, regression and tagging tasks; question answering
(span) is refused: its dev features carry no answer positions to take a loss on.

`--input`: a labelled file the task reads (as `bert-jax predict` reads it) or the task's data directory (its
dev split is read). task.json does not record the finetuning's data_dir, so there is no default.
"""

import dataclasses
import functools
import json
import math
import os
import shutil
import sys
import time

from absl import app
from absl import flags
from etils import epath
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import checkpoint_loader
from bert_jax import checkpointing
from bert_jax import failures
from bert_jax import paths
from bert_jax.analysis import heads as head_stats
from bert_jax.analysis import prune_report
from bert_jax.finetune import task_record
from bert_jax.finetune import task_model
from bert_jax.models import pruning
from bert_jax.tools import predict

FLAGS = flags.FLAGS
KINDS = ("classification", "regression", "tagging")   # tasks whose dev features hold their labels
FRACTIONS = tuple(i / 10 for i in range(10))           # 0%, 10%, ..., 90% of the heads


def define_flags() -> None:
  """The command's flags, defined when the CLI runs it: importing `prune` defines none."""
  flags.DEFINE_string("checkpoint", None, "A finetuned workdir (bert-jax finetune), or its best/.",
                      allow_override=True)
  flags.DEFINE_string("input", None, "Labelled dev data: a file the task reads, or the task's data directory.",
                      allow_override=True)
  flags.DEFINE_string("output_dir", None, "prune.csv, prune.png, importance.csv, importance.png go here.",
                      allow_override=True)
  flags.DEFINE_list("fractions", [str(f) for f in FRACTIONS], "Fractions of all heads to mask, in [0, 1).")
  flags.DEFINE_bool("iterative", False, "Recompute the importance on the masked model after every fraction.")
  flags.DEFINE_float("export_fraction", 0.4, "The fraction of heads removed from the exported model.")
  flags.DEFINE_string("export_dir", None, "Where the pruned finetuned workdir goes (none: no export).")
  flags.DEFINE_string("text_a", None, "A sentence task's input: its text column, if not the training files' one.",
                      allow_override=True)
  flags.DEFINE_string("text_b", None, "A sentence task's input: its second text column (sentence pairs), if not "
                      "the training files' one.", allow_override=True)
  flags.DEFINE_integer("batch_size", 32, "Examples per forward pass.", allow_override=True, lower_bound=1)
  flags.DEFINE_integer("timing_repeats", 7, "Timed forward passes of each model (alternating; medians).",
                       lower_bound=1)
  flags.DEFINE_integer("timing_batches", 8, "Dev batches in one timed forward pass (0: all).", lower_bound=0)


@dataclasses.dataclass
class Dev:
  """Labelled examples, their features and meta (`Task.featurize`)."""
  examples: list
  features: dict
  meta: dict


def read_dev(predictor: predict.Predictor, source: str) -> Dev:
  """The labelled examples of `source`: a file (read as `bert-jax predict` reads it) or a data directory (the
  task's dev split). Raises ValueError (readers.DataError) for an unlabelled example or a refused task kind."""
  task = predictor.task
  if task.kind not in KINDS:
    raise ValueError(f"`analyze prune` takes a {', '.join(KINDS)} task; {task.name} is {task.kind!r}: its dev "
                     "features carry no answer positions to take the loss of")
  if os.path.isdir(source):
    examples = task.read(task.dev_splits[0], source)
  else:
    examples = predictor.read(source)
  task.check_labelled(examples, source)
  features, meta = task.featurize(examples, predictor.tokenizer, predictor.max_seq_length)
  return Dev(examples, features, meta)


# ------------------------------------------------------------------------------------------------
# Importance (Michel et al. 2019, 4.1).


@functools.lru_cache(maxsize=8)   # one compilation per model (flax modules compare by value), not per call
def _abs_grad_sum(model, kind: str):
  """Jitted (params, batch, real [B], head_mask) -> sum over real rows of |dL(x)/d head_mask| [layers, heads]."""

  def loss_one(head_mask, params, row):
    batch = jax.tree.map(lambda x: x[None], row)
    outputs = model.apply({"params": params}, batch["input_ids"], batch["input_mask"], batch["segment_ids"],
                          deterministic=True, head_mask=head_mask)
    sums = task_model.loss_sums(kind, outputs, batch)   # tagging: the mean over the example's labelled tokens
    return sums["loss_sum"] / jnp.maximum(sums["weight"], 1.0)

  def abs_grad_sum(params, batch, real, head_mask):
    g_BNH = jax.vmap(jax.grad(loss_one), in_axes=(None, None, 0))(head_mask, params, batch)
    return jnp.einsum("b,bnh->nh", real, jnp.abs(g_BNH))

  return jax.jit(abs_grad_sum)


def _batch_rows(start: int, n: int, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
  """Row indices of the batch from `start` (the last padded with copies of row `start`) and 1/0 for real rows."""
  rows = np.arange(start, start + batch_size)
  real = rows < n
  rows[~real] = start
  return rows, real.astype(np.float32)


def head_importance(model, params, features: dict, kind: str, head_mask, batch_size: int = 32) -> np.ndarray:
  """Unnormalised I_h = mean over the rows of `features` of |dL(x)/d xi_h| at `head_mask`; [layers, heads]."""
  fn = _abs_grad_sum(model, kind)
  head_mask = jnp.asarray(head_mask, jnp.float32)
  n = len(features["input_ids"])
  total = jnp.zeros(head_mask.shape, jnp.float32)
  for start in range(0, n, batch_size):
    rows, real = _batch_rows(start, n, batch_size)
    total = total + fn(params, {k: v[rows] for k, v in features.items()}, real, head_mask)  # stays on device
  return np.asarray(total) / n


def normalise_by_layer(scores: np.ndarray) -> np.ndarray:
  """Each layer's scores over their l2 norm (Michel et al.'s code, `normalize_scores_by_layer`)."""
  return scores / (np.linalg.norm(scores, axis=-1, keepdims=True) + 1e-20)


def pruning_order(scores: np.ndarray) -> list[tuple[int, int]]:
  """All (layer, head), least important first; ties by layer, then head."""
  layers, heads = np.indices(scores.shape)
  order = np.lexsort((heads.ravel(), layers.ravel(), scores.ravel()))
  return [(int(layers.flat[i]), int(heads.flat[i])) for i in order]


def num_pruned(fraction: float, num_heads: int) -> int:
  """Heads masked at `fraction` of `num_heads` (rounded half up: 40% of 72 is 29)."""
  if not 0.0 <= fraction < 1.0:
    raise ValueError(f"fraction {fraction}: in [0, 1)")
  return int(math.floor(fraction * num_heads + 0.5))


def mask_without(shape, heads) -> np.ndarray:
  """A head mask of ones with 0 at each (layer, head) of `heads`."""
  mask = np.ones(shape, np.float32)
  for layer, head in heads:
    mask[layer, head] = 0.0
  return mask


def by_layer(heads) -> dict[int, list[int]]:
  """{layer: sorted heads} of (layer, head) pairs, as `prune_heads` takes them."""
  out = {}
  for layer, head in sorted(heads):
    out.setdefault(layer, []).append(head)
  return out


# ------------------------------------------------------------------------------------------------
# The curve: the dev metric with the least important heads masked.


@functools.lru_cache(maxsize=8)
def _masked_forward(model):
  """Jitted (params, batch, head_mask) -> the head's outputs; the mask is an argument (one compilation)."""
  return jax.jit(lambda params, batch, head_mask: model.apply(
      {"params": params}, batch["input_ids"], batch["input_mask"], batch["segment_ids"], deterministic=True,
      head_mask=head_mask))


def masked_outputs(forward, params, features: dict, head_mask, batch_size: int):
  """The outputs of `_masked_forward(model)` on every row of `features`, as numpy."""
  head_mask = jnp.asarray(head_mask, jnp.float32)
  return predict.run_batches(lambda p, b: forward(p, b, head_mask), params, features, batch_size)


def curve(model, params, task, dev: Dev, fractions, *, iterative: bool = False, batch_size: int = 32):
  """(rows {fraction, heads_pruned, <metric>, heads}, normalised scores, raw scores) as `--fractions` asks.

  The importance is computed at the full model; with `iterative`, again on the masked model before each
  fraction that masks more heads, and the next heads are the least important of those still unmasked.
  """
  cfg = model.config
  shape = (cfg.num_layers, cfg.num_heads)
  raw = head_importance(model, params, dev.features, task.kind, np.ones(shape), batch_size)
  scores = normalise_by_layer(raw)
  forward, pruned, rows = _masked_forward(model), [], []
  for fraction in sorted(fractions):
    target = num_pruned(fraction, math.prod(shape))
    if iterative and pruned and target > len(pruned):
      step_scores = normalise_by_layer(head_importance(model, params, dev.features, task.kind,
                                                       mask_without(shape, pruned), batch_size))
    else:
      step_scores = scores
    pruned += [h for h in pruning_order(step_scores) if h not in pruned][:target - len(pruned)]
    mask = mask_without(shape, pruned)
    metrics = task.evaluate(masked_outputs(forward, params, dev.features, mask, batch_size), dev.examples, dev.meta)
    rows.append({"fraction": fraction, "heads_pruned": len(pruned), task.primary_metric: metrics[task.primary_metric],
                 "heads": " ".join(f"{l}:{h}" for l, h in sorted(pruned))})
  return rows, scores, raw


# ------------------------------------------------------------------------------------------------
# Export: the heads removed from the weights, a finetuned workdir, checked and timed.


def without_heads(cfg, params, heads) -> tuple:
  """(config, params, {layer: head}) with `heads` [(layer, head)] removed from the weights; a layer that would
  lose every head keeps its first, silenced (`pruning.silence_heads`), which the dict names."""
  removed, silenced = by_layer(heads), {}
  for layer, hs in removed.items():
    if set(cfg.kept_heads(layer)) <= set(hs):
      silenced[layer] = min(cfg.kept_heads(layer))
      removed[layer] = [h for h in hs if h != silenced[layer]]
  cfg, params = pruning.prune_heads(cfg, params, removed)
  return cfg, pruning.silence_heads(cfg, params, silenced), silenced


def export(checkpoint: str, predictor: predict.Predictor, heads, export_dir: str):
  """Writes a finetuned workdir without `heads` [(layer, head)] at `export_dir`, as `bert-jax finetune` writes
  one (run record, task.json, best/); returns its (config, params)."""
  cfg, params, silenced = without_heads(predictor.model_config, predictor.params, heads)
  for layer, head in silenced.items():
    print(f"layer {layer} loses every head: head {head} is kept with its output weights at zero (a checkpoint "
          "holds no empty array); it computes what the layer computes without heads", file=sys.stderr)
  tokenizer = predictor.tokenizer
  checkpoint_loader.write_run_record(export_dir, cfg, tokenizer.source_file, tokenizer.do_lower_case)
  source = epath.Path(checkpoint_loader.find(checkpoint).directory) / task_record.TASK_FILE   # the same task
  shutil.copyfile(str(source), os.path.join(export_dir, task_record.TASK_FILE))
  best = checkpointing.Checkpointer(os.path.join(export_dir, "best"), keep=1, async_save=False)
  best.save(0, {"params": jax.tree.map(np.asarray, params)})
  best.close()
  return cfg, params


def check_export_dir(export_dir: str) -> None:
  """Refuses an `--export_dir` that is a file or holds anything: an export over another would mix its
  weights with this one's config (a model that no longer loads), and deleting what is there is the user's
  call."""
  paths.output_dir(export_dir, "export_dir")   # it, or a folder above it, a file: NotADirectoryError
  if os.path.isdir(export_dir) and os.listdir(export_dir):
    raise FileExistsError(f"--export_dir={export_dir} already holds files (an earlier export?): give a new folder, "
                          "or delete that one first")


def count_params(params) -> int:
  return int(sum(np.size(x) for x in jax.tree.leaves(params)))


def time_forward(runs: dict, repeats: int) -> dict[str, float]:
  """Median seconds of each zero-argument callable of `runs` (its result blocked on): one warm-up call each,
  then `repeats` rounds calling them in turn, so that a busy machine slows all alike."""
  for fn in runs.values():
    jax.block_until_ready(fn())
  seconds = {name: [] for name in runs}
  for _ in range(repeats):
    for name, fn in runs.items():
      t0 = time.perf_counter()
      jax.block_until_ready(fn())
      seconds[name].append(time.perf_counter() - t0)
  return {name: float(np.median(s)) for name, s in seconds.items()}


def check_export(predictor: predict.Predictor, pruned: predict.Predictor, dev: Dev, heads, *, batch_size: int,
                 repeats: int, timing_batches: int = 8) -> dict:
  """The pruned model's outputs against the masked model's on `dev`, both parameter counts, and the forward
  times of both on the first `timing_batches` batches of `dev` (0: all)."""
  model = task_model.build_model(predictor.model_config, predictor.task, predictor.scalar_mix)
  pruned_model = task_model.build_model(pruned.model_config, pruned.task, pruned.scalar_mix)
  cfg = predictor.model_config
  mask = jnp.asarray(mask_without((cfg.num_layers, cfg.num_heads), heads))
  masked_fn, plain_fn = _masked_forward(model), jax.jit(functools.partial(task_model.predict_step, model=model))
  pruned_fn = jax.jit(functools.partial(task_model.predict_step, model=pruned_model))
  masked = masked_outputs(masked_fn, predictor.params, dev.features, mask, batch_size)
  out = predict.run_batches(pruned_fn, pruned.params, dev.features, batch_size)
  error = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
              for a, b in zip(jax.tree.leaves(masked), jax.tree.leaves(out)))
  metrics = pruned.task.evaluate(out, dev.examples, dev.meta)
  # The timed work: the same device-resident batches through each model.
  keys = ("input_ids", "input_mask", "segment_ids")
  n = len(dev.features["input_ids"])
  starts = range(0, n, batch_size)[:timing_batches or None]
  batches = [jax.device_put({k: dev.features[k][_batch_rows(s, n, batch_size)[0]] for k in keys}) for s in starts]
  params, pruned_params = jax.device_put(predictor.params), jax.device_put(pruned.params)
  seconds = time_forward({"unpruned": lambda: [plain_fn(params, b) for b in batches],
                          "pruned": lambda: [pruned_fn(pruned_params, b) for b in batches]}, repeats)
  return {"heads_removed": len(heads), "max_abs_error": error, pruned.task.primary_metric:
          metrics[pruned.task.primary_metric], "params_unpruned": count_params(predictor.params),
          "params_pruned": count_params(pruned.params), "examples": n, "batch_size": batch_size,
          "timed_examples": min(n, len(batches) * batch_size),
          "forward_s_unpruned": seconds["unpruned"], "forward_s_pruned": seconds["pruned"],
          "speedup": seconds["unpruned"] / seconds["pruned"], "repeats": repeats, "device": jax.devices()[0].platform}


# ------------------------------------------------------------------------------------------------
# Command line.


def run(checkpoint: str, source: str, output_dir: str, fractions, *, iterative: bool = False,
        export_fraction: float | None = None, export_dir: str | None = None, batch_size: int = 32,
        timing_repeats: int = 7, timing_batches: int = 8, text_a: str | None = None,
        text_b: str | None = None) -> dict:
  """What the command does (module docstring); returns its summary (also printed by `main`). `text_a` and
  `text_b` name a sentence task's text columns in `source` where they are not the training files' ones."""
  predictor = predict.Predictor.load(checkpoint, text_a, text_b)
  dev = read_dev(predictor, source)
  model = task_model.build_model(predictor.model_config, predictor.task, predictor.scalar_mix)
  task, cfg = predictor.task, predictor.model_config
  if export_dir and not pruning.prunable(cfg):
    raise ValueError("--export_dir: heads can be removed only from per-layer attention weights, not from "
                     f"{cfg.model_type}'s shared layers; the curve needs no export (leave --export_dir out)")
  total = cfg.num_layers * cfg.num_heads
  rows, scores, raw = curve(model, predictor.params, task, dev, fractions, iterative=iterative,
                            batch_size=batch_size)
  os.makedirs(output_dir, exist_ok=True)
  prune_report.write_csv(os.path.join(output_dir, "prune.csv"), rows)
  prune_report.write_csv(os.path.join(output_dir, "importance.csv"), prune_report.importance_rows(scores, raw))
  name = f"{task.name}, {len(dev.examples)} dev examples"
  prune_report.plot_curve(os.path.join(output_dir, "prune.png"), rows, task.primary_metric, total, name)
  head_stats.plot_heatmap(os.path.join(output_dir, "importance.png"), scores,
                          f"head importance (Michel et al. 2019), normalised per layer; {name}")
  summary = {"checkpoint": paths.absolute(checkpoint), "examples": len(dev.examples), "heads": total,
             "iterative": iterative,
             "metric": task.primary_metric, "curve": [{k: v for k, v in r.items() if k != "heads"} for r in rows]}
  if export_dir:
    masked = [r["heads"] for r in rows if r["fraction"] == export_fraction]   # --iterative's choice, if it made one
    heads = ([tuple(int(i) for i in h.split(":")) for h in masked[0].split()] if masked else
             pruning_order(scores)[:num_pruned(export_fraction, total)])
    export(checkpoint, predictor, heads, export_dir)
    summary["export"] = {"export_dir": export_dir, "fraction": export_fraction, **check_export(
        predictor, predict.Predictor.load(export_dir), dev, heads, batch_size=batch_size, repeats=timing_repeats,
        timing_batches=timing_batches)}
    with open(os.path.join(output_dir, "export.json"), "w") as f:
      json.dump(summary["export"], f, indent=1)
  return summary


def main(argv) -> None:
  """`bert-jax analyze prune` (see the module docstring)."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  for name in ("checkpoint", "input", "output_dir"):
    if FLAGS[name].value is None:
      raise app.UsageError(f"--{name} is required")
  # The user's files, task or fractions: say which and why.
  # An --output_dir that cannot be made (a file there) too, before the work.
  with failures.as_user_errors("bert-jax analyze prune", OSError, ValueError):
    paths.output_file(os.path.join(FLAGS.output_dir, "prune.csv"))
    fractions = [float(f) for f in FLAGS.fractions]
    for f in fractions + ([FLAGS.export_fraction] if FLAGS.export_dir else []):
      num_pruned(f, 1)   # in [0, 1), else ValueError
    if FLAGS.export_dir:
      check_export_dir(FLAGS.export_dir)
    summary = run(FLAGS.checkpoint, FLAGS.input, FLAGS.output_dir, fractions, iterative=FLAGS.iterative,
                  export_fraction=FLAGS.export_fraction, export_dir=FLAGS.export_dir, batch_size=FLAGS.batch_size,
                  timing_repeats=FLAGS.timing_repeats, timing_batches=FLAGS.timing_batches,
                  text_a=FLAGS.text_a, text_b=FLAGS.text_b)
  print(json.dumps(summary, indent=1))

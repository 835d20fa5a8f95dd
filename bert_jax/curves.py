"""A PNG of a run's learning curves, drawn from its `metrics.jsonl` (bert_jax/metrics_writer.py).

    bert_jax.curves.plot_pretraining(workdir)   # -> <workdir>/curves.png

Two panels: the loss and accuracy of the objective's main term (MLM, or the next-token LM), train (interval means) and held-out evaluation, with the
held-out unigram baseline (always the most frequent target) as a dashed line when it was measured.
"""

import json
import os

from bert_jax import atomic_write


def read_metrics(path: str) -> list[dict]:
  """The records of a metrics.jsonl, in file order (a resumed run appends to the same file)."""
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def _series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
  points = {r["step"]: r[key] for r in records if key in r}   # a replayed step keeps its last value
  steps = sorted(points)
  return steps, [points[s] for s in steps]


def plot_pretraining(workdir: str, filename: str = "curves.png", term: str = "mlm") -> str:
  """Draws `<workdir>/metrics.jsonl` into `<workdir>/<filename>`; returns the PNG's path.

  `term` is the loss term drawn (`<split>/<term>_loss`, `_accuracy`): an objective's first LOSS_TERMS key."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  records = read_metrics(os.path.join(workdir, "metrics.jsonl"))
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  name = term.upper()
  for ax, metric, title in ((axes[0], f"{term}_loss", f"{name} loss"), (axes[1], f"{term}_accuracy", f"{name} accuracy")):
    for split, style in (("train", "-"), ("eval", "o-")):
      steps, values = _series(records, f"{split}/{metric}")
      if steps:
        ax.plot(steps, values, style, label="held-out" if split == "eval" else "train", markersize=4)
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
  _, baseline = _series(records, "eval/unigram_accuracy")
  if baseline:
    axes[1].axhline(baseline[-1], linestyle="--", color="gray", label="held-out unigram baseline")
  for ax in axes:
    if ax.get_legend_handles_labels()[0]:   # a run stopped before its first log step has no curve yet
      ax.legend()
  fig.tight_layout()
  path = os.path.join(workdir, filename)
  with atomic_write.replacing(path) as tmp:   # whole or absent: a signal while it is drawn leaves the last one
    fig.savefig(tmp, dpi=100, format="png")
  plt.close(fig)
  return path

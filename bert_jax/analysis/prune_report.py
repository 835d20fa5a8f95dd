"""What `bert-jax analyze prune` (bert_jax/analysis/prune.py) writes besides its heat map: prune.csv and
importance.csv, and the curve of the dev metric against the share of heads masked (prune.png).
"""

import csv

from absl import logging
import numpy as np


def write_csv(path: str, rows: list[dict]) -> None:
  with open(path, "w", newline="", encoding="utf-8") as f:
    writer = csv.DictWriter(f, list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)


def importance_rows(scores: np.ndarray, raw: np.ndarray) -> list[dict]:
  return [{"layer": l, "head": h, "score": f"{scores[l, h]:.6g}", "raw_score": f"{raw[l, h]:.6g}"}
          for l in range(scores.shape[0]) for h in range(scores.shape[1])]


def plot_curve(path: str, rows: list[dict], metric: str, num_heads: int, title: str) -> bool:
  """The dev metric against the percentage of heads masked, the unpruned model's as a dotted line; False
  without matplotlib."""
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  except ImportError:
    logging.warning("matplotlib is not installed: no %s", path)
    return False
  fig, ax = plt.subplots(figsize=(5.5, 3.8))
  ax.plot([100 * r["heads_pruned"] / num_heads for r in rows], [r[metric] for r in rows], marker="o")
  full = [r[metric] for r in rows if r["heads_pruned"] == 0]
  if full:
    ax.axhline(full[0], color="gray", linestyle=":", linewidth=1)
  ax.set_xlabel(f"heads masked, % of {num_heads} (least important first)")
  ax.set_ylabel(f"dev {metric}")
  ax.set_title(title, fontsize=10)
  ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return True

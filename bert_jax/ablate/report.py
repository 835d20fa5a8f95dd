"""The tables and the plot of an ablation, from the runner's markers (`runner.collect`).

    results.md    one table per measurement (held-out metric, each finetuning task): ours as mean +- std
                  over seeds, the paper's number, the difference to the reference variant with Welch's
                  p-value (does it exceed the seed variation?), and whether the ordering agrees with the paper
    results.csv   the same, one row per (variant, measurement)
    results.png   held-out metric and downstream score against parameters (`plot: "size"`), or grouped bars
                  of ours and the paper's per variant (`plot: "bars"`)

Finetuning metrics are fractions in the trainer; here they are percentages, as the papers print them.
"""

import csv
import itertools
import math
import os

from bert_jax import atomic_write
from bert_jax.ablate import stats

CSV_FIELDS = ("table", "variant", "label", "measurement", "metric", "n", "mean", "std", "paper", "delta",
              "p_value", "exceeds_seed_variation", "paper_delta", "ordering_agrees", "parameters", "steps",
              "tokens", "flops")


def lower_is_better(metric: str) -> bool:
  return "perplexity" in metric or "loss" in metric


def measurements(ablation, rows: list[dict]) -> list[dict]:
  """One record per (measurement, variant): our values, their mean and spread, the paper's number."""
  out = []
  paper_key = dict(ablation.paper.columns)
  for r, v in zip(rows, ablation.variants):
    pre, ev = r["pretrained"] or {}, r["evaluated"]
    common = {"variant": r["variant"], "label": r["label"], "parameters": pre.get("parameters"),
              "steps": pre.get("train_steps"), "tokens": pre.get("tokens"), "flops": pre.get("flops")}
    heldout = [ev[r["heldout_metric"]]] if ev and r["heldout_metric"] in ev else []
    out.append({**common, "measurement": "heldout", "metric": r["heldout_metric"], "values": heldout,
                "paper": v.paper.get(paper_key.get("heldout", ""))})
    for task, done in r["finetuned"].items():
      values = [100.0 * s for s in done["scores"]] if done else []
      out.append({**common, "measurement": task, "metric": done["metric"] if done else "",
                  "values": values, "paper": v.paper.get(paper_key.get(task, ""))})
  for m in out:
    m["n"] = len(m["values"])
    m["mean"], m["std"] = stats.mean_std(m["values"]) if m["values"] else (math.nan, math.nan)
  return out


def compare(ablation, records: list[dict]) -> list[dict]:
  """Adds to every record its difference to the reference variant (ours and the paper's), Welch's test
  over seeds, and whether the sign of our difference is the paper's."""
  reference = ablation.reference or ablation.variants[0].name
  for name, group in itertools.groupby(sorted(records, key=lambda m: m["measurement"]), lambda m: m["measurement"]):
    group = list(group)
    ref = next((m for m in group if m["variant"] == reference), None)
    for m in group:
      m.update(delta=math.nan, p_value=math.nan, exceeds_seed_variation=None, paper_delta=math.nan,
               ordering_agrees=None)
      if ref is None or m is ref or not m["values"] or not ref["values"] or m["metric"] != ref["metric"]:
        continue   # nothing to compare: not run, or another objective's own metric
      m["delta"] = m["mean"] - ref["mean"]
      test = stats.welch_t_test(m["values"], ref["values"])
      m["p_value"] = test.p
      m["exceeds_seed_variation"] = test.significant if not math.isnan(test.p) else None
      if m["paper"] is not None and ref["paper"] is not None:
        m["paper_delta"] = m["paper"] - ref["paper"]
        # A tie of ours (or the paper's) is no ordering: neither agrees nor disagrees.
        if _sign(m["delta"]) and _sign(m["paper_delta"]):
          m["ordering_agrees"] = _sign(m["delta"]) == _sign(m["paper_delta"])
  return records


def pair_agreement(group: list[dict]) -> tuple[int, int, int, int]:
  """(pairs ordered as in the paper, pairs ordered by both, pairs of those with a test (two seeds or more on
  each side), pairs whose difference exceeds the seed variation) over the pairs of variants of one
  measurement with the same metric; ties have no order."""
  usable = [m for m in group if m["values"] and m["paper"] is not None]
  agree = total = tested = significant = 0
  for a, b in itertools.combinations(usable, 2):
    if a["metric"] != b["metric"] or not _sign(a["mean"] - b["mean"]) or not _sign(a["paper"] - b["paper"]):
      continue
    total += 1
    agree += _sign(a["mean"] - b["mean"]) == _sign(a["paper"] - b["paper"])
    test = stats.welch_t_test(a["values"], b["values"])
    tested += not math.isnan(test.p)
    significant += test.significant
  return agree, total, tested, significant


def size_order(group: list[dict]) -> tuple[int, int, int]:
  """(pairs of variants of different size where the larger is better, such pairs with a difference,
  ties left out) over one measurement's variants with the same metric; all pairs agreeing means ours is
  monotone in size."""
  usable = [m for m in group if m["values"] and m["parameters"]]
  better = total = ties = 0
  for a, b in itertools.combinations(usable, 2):
    if a["metric"] != b["metric"] or a["parameters"] == b["parameters"]:
      continue
    small, large = sorted((a, b), key=lambda m: m["parameters"])
    gain = _sign(large["mean"] - small["mean"]) * (-1 if lower_is_better(large["metric"]) else 1)
    ties += gain == 0
    total += gain != 0
    better += gain > 0
  return better, total, ties


def _sign(x: float, tie: float = 1e-9) -> int:
  """-1, 0 or 1; differences within `tie` (float rounding of equal means) are ties."""
  return 0 if abs(x) <= tie else (1 if x > 0 else -1)


# ------------------------------------------------------------------------------------------------
# Writers.


def _fmt(x, digits: int = 2) -> str:
  if x is None or (isinstance(x, float) and math.isnan(x)):
    return "-"
  return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def _paper(x) -> str:
  """A published number (or a difference of two) with the digits it was printed with."""
  return "-" if x is None or math.isnan(x) else f"{round(x, 4):g}"


def _flops(x) -> str:
  return "-" if x is None else f"{x:.3g}"


def _p(p: float) -> str:
  return "-" if math.isnan(p) else "<0.001" if p < 0.001 else f"{p:.3f}"


def _yes_no(x) -> str:
  return "-" if x is None else ("yes" if x else "no")


def write_markdown(ablation, records: list[dict], path: str) -> str:
  reference = ablation.reference or ablation.variants[0].name
  columns = dict(ablation.paper.columns)
  lines = [f"# {ablation.title}", "", f"Budget: {ablation.budget.description}", "",
           f"Paper: {ablation.paper.source}", "",
           f"Differences are to `{reference}`; p is Welch's two-sided t-test over finetuning seeds, and a "
           f"difference exceeds the seed variation when p < {stats.ALPHA} (a held-out metric comes from one "
           "pretraining run: no test)."]
  if ablation.paper.note:
    lines += ["", ablation.paper.note]
  order = ["heldout"] + [t for t in ablation.tasks]
  for name in order:
    group = [m for m in records if m["measurement"] == name]
    if not group:
      continue
    metric = next((m["metric"] for m in group if m["metric"]), name)
    paper_col = columns.get(name, "")
    heldout = name == "heldout"
    title = "held-out evaluation of the pretraining objective (its own metric)" if heldout else f"{name}: dev {metric} (%)"
    lines += ["", f"## {title}", "",
              f"| variant | encoder params |{' steps | tokens | FLOPs | metric |' if heldout else ''} ours (mean ± std, n) | "
              f"paper ({paper_col or 'none'}) | Δ ours | p | exceeds seed variation | Δ paper | ordering agrees |",
              f"|---|---:|{'---:|---:|---:|---|' if heldout else ''}---:|---:|---:|---:|:---:|---:|:---:|"]
    for m in group:
      ours = ("not run" if not m["values"] else f"{m['mean']:.2f} (n=1)" if m["n"] == 1 else
              f"{m['mean']:.2f} ± {m['std']:.2f} (n={m['n']})")
      exceeds = "untested (n=1)" if m["n"] == 1 and not math.isnan(m["delta"]) else _yes_no(m["exceeds_seed_variation"])
      where = (f" {_fmt(m['steps'])} | {_fmt(m['tokens'])} | {_flops(m['flops'])} | {m['metric']}"
               f"{' (lower is better)' if lower_is_better(m['metric']) else ''} |") if heldout else ""
      agrees = "tie" if not math.isnan(m["delta"]) and not _sign(m["delta"]) else _yes_no(m["ordering_agrees"])
      lines.append(f"| {m['label']} | {_fmt(m['parameters'])} |{where} {ours} | {_paper(m['paper'])} | "
                   f"{_fmt(m['delta'])} | {_p(m['p_value'])} | {exceeds} | "
                   f"{_paper(m['paper_delta'])} | {agrees} |")
    agree, total, tested, significant = pair_agreement(group)
    if total:
      spread = (f"our difference exceeds the seed variation in {significant} of the {tested} pairs with a test"
                if tested else "one run each: no test of our differences")
      lines += ["", f"Pairs of variants ordered as in the paper: {agree} of {total} (ties left out); {spread}."]
    if ablation.plot == "size" and (sized := size_order(group))[1]:
      better, total, ties = sized
      lines += ["", f"Larger model better in {better} of {total} pairs of different size"
                    f"{f' ({ties} ties left out)' if ties else ''}: "
                    f"{'monotone' if better == total else 'not monotone'} in size."]
  text = "\n".join(lines) + "\n"
  with atomic_write.replacing(path) as tmp, open(tmp, "w") as f:
    f.write(text)
  return text


def write_csv(ablation, records: list[dict], path: str) -> None:
  with atomic_write.replacing(path) as tmp, open(tmp, "w", newline="") as f:
    w = csv.DictWriter(f, CSV_FIELDS, extrasaction="ignore")
    w.writeheader()
    for m in records:
      w.writerow({**m, "table": ablation.name,
                  **{k: "" if m[k] is None or (isinstance(m[k], float) and math.isnan(m[k])) else m[k]
                     for k in ("mean", "std", "paper", "delta", "p_value", "paper_delta", "exceeds_seed_variation",
                               "ordering_agrees", "parameters", "steps", "tokens", "flops")}})


def plot(ablation, records: list[dict], path: str) -> str:
  """`ablation.plot` "size": held-out metric and each task against encoder parameters (log axis), ours
  with the paper's on a second axis; "bars": per measurement, ours (error bar: std over seeds) beside
  the paper's for every variant."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  # One panel per measurement and metric: objectives with their own held-out metric get their own panel.
  panels = {}
  for m in records:
    if m["values"] or m["measurement"] != "heldout":
      panels.setdefault((m["measurement"], m["metric"] if m["measurement"] == "heldout" else ""), []).append(m)
  panels = sorted(panels.items(), key=lambda kv: kv[0][0] != "heldout")   # held-out first, tasks in order
  fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
  for ax, ((name, _), group) in zip(axes[0], panels):
    metric = next((m["metric"] for m in group if m["metric"]), "")
    if ablation.plot == "size":
      _size_panel(ax, group)
    else:
      _bars_panel(ax, group)
    ax.set_title(f"held-out {metric}" if name == "heldout" else f"{name} dev {metric} (%)")
  fig.suptitle(ablation.title, fontsize=10)
  fig.tight_layout()
  with atomic_write.replacing(path) as tmp:
    fig.savefig(tmp, dpi=100, format="png")
  plt.close(fig)
  return path


def _size_panel(ax, group: list[dict]) -> None:
  pts = sorted((m["parameters"], m["mean"], m["std"], m["paper"]) for m in group if m["values"] and m["parameters"])
  if pts:
    x, mean, std, paper = zip(*pts)
    ax.errorbar(x, mean, yerr=std, marker="o", capsize=3, label="ours")
    ax.set_xscale("log")
    ax.set_xlabel("encoder parameters")
    if any(p is not None for p in paper):
      twin = ax.twinx()   # the paper's models are far larger: their own axis, same x positions
      twin.plot([a for a, p in zip(x, paper) if p is not None], [p for p in paper if p is not None], "s--",
                color="gray", label="paper (right axis, at our sizes)")
      twin.legend(loc="lower right", fontsize=8)
  ax.legend(loc="upper left", fontsize=8)
  ax.grid(alpha=0.3)


def _bars_panel(ax, group: list[dict]) -> None:
  import numpy as np  # pylint: disable=g-import-not-at-top
  x = np.arange(len(group))
  ours = [m["mean"] if m["values"] else 0.0 for m in group]
  err = [m["std"] if m["values"] else 0.0 for m in group]
  paper = [m["paper"] for m in group]
  with_paper = any(p is not None for p in paper)
  ax.bar(x - 0.2 if with_paper else x, ours, 0.4, yerr=err, capsize=3, label="ours")
  if with_paper:
    ax.bar(x + 0.2, [p or 0.0 for p in paper], 0.4, color="gray", label="paper")
  ax.set_xlim(-0.8, len(group) - 0.2)
  ax.set_xticks(x)
  ax.set_xticklabels([m["label"] for m in group], rotation=20, ha="right", fontsize=8)
  ax.legend(fontsize=8)
  ax.grid(alpha=0.3, axis="y")


def write_all(ablation, rows: list[dict], workdir: str) -> str:
  """results.md, results.csv and results.png in `workdir`; returns the Markdown."""
  records = compare(ablation, measurements(ablation, rows))
  text = write_markdown(ablation, records, os.path.join(workdir, "results.md"))
  write_csv(ablation, records, os.path.join(workdir, "results.csv"))
  plot(ablation, records, os.path.join(workdir, "results.png"))
  return text

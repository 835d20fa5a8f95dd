"""`bert-jax sweep`: grid or random search over finetuning hyperparameters and seeds, with a results table.

    bert-jax sweep --config=configs/finetune/sst2.py --workdir=/tmp/sst2_sweep \
        --config.init_checkpoint=/path/to/bert --config.data_dir=/path/to/SST-2

The grid (`config.sweep.grid`) defaults to Devlin et al. 2019, Appendix A.3: batch {16, 32}, learning
rate {5e-5, 3e-5, 2e-5}, epochs {2, 3, 4}, each with every seed of `config.sweep.seeds`.

* Every trial runs in `<workdir>/trials/<name>/`; `DONE` (its results as JSON) marks it finished, so an
  interrupted sweep run again skips finished trials and redoes only the others. The sweep's config is
  recorded beside (`sweep_config.json`): a run again with another checkpoint, data or model settings stops.
* Trials differing only in learning rate and seed train together in one vmapped step
  (`trainer.finetune_trials`), up to `sweep.max_trials_per_group` at once: each data parallel over all
  devices, or with `--config.trials_over_devices` one trial per group of devices.
* Successive halving (`sweep.successive_halving`; Jamieson and Talwalkar 2016): every trial first runs
  `halving_min_epochs` epochs; the best 1/eta configurations by dev metric (the mean over their seeds)
  continue, all their seeds, from their checkpoints for eta times as many, and so on until their full
  `num_epochs`; each rung leaves `rung_<r>.json`.
* Results: `results.md` and `results.csv` (mean +- std over seeds per configuration whose every seed
  finished, the best one marked), `trials.csv` (one row per trial) and `lr.png` (dev metric against learning rate).
"""

import csv
import glob
import itertools
import json
import math
import os
import shutil
import time

import numpy as np

from absl import app
from absl import flags
from absl import logging

from bert_jax import atomic_write
from bert_jax import cli
from bert_jax import config_loading
from bert_jax import config_record
from bert_jax import failures
from bert_jax import paths
# The --config and --workdir flags of `bert-jax finetune` (importing it also puts `configs/` on sys.path).
from bert_jax.finetune import config_checks
from bert_jax.finetune import main as finetune_main
from bert_jax.finetune import run_workdir
from bert_jax.finetune import task_record
from bert_jax.finetune import trainer

_SUMMARIZE = flags.DEFINE_list("summarize", [], "Sweep directories: write <workdir>/summary.md, the best "
                                "configuration of each (one per task), instead of running a sweep.")
DONE = "DONE"
HPARAMS = ("batch_size", "learning_rate", "num_epochs")
CONFIG = "sweep_config.json"
# Fields a finished trial's result does not depend on: each trial's own hyperparameters, which trials the
# sweep makes and how it groups them, logging and the device layout.
RESULT_FREE = (*HPARAMS, "seed", "sweep.grid", "sweep.seeds", "sweep.mode", "sweep.num_random_trials",
               "sweep.random_seed", "sweep.vmap_trials", "sweep.max_trials_per_group",
               *run_workdir.LOGGING_AND_LAYOUT)


# ------------------------------------------------------------------------------------------------
# Trials.


def trial_name(hp: dict) -> str:
  return f"bs{hp['batch_size']}_lr{hp['learning_rate']:g}_ep{hp['num_epochs']}_seed{hp['seed']}"


def make_trials(config) -> list[dict]:
  """Hyperparameter assignments {batch_size, learning_rate, num_epochs, seed}, every one with every seed.

  "grid": the product of `sweep.grid`. "random": `num_random_trials` configurations with the learning
  rate log-uniform between the grid's extremes and batch size and epochs drawn from the grid.
  """
  s = config.sweep
  grid = {k: list(s.grid[k]) for k in HPARAMS}
  if s.mode == "grid":
    configs = [dict(zip(HPARAMS, values)) for values in itertools.product(*(grid[k] for k in HPARAMS))]
  elif s.mode == "random":
    rng = np.random.default_rng(s.random_seed)
    lo, hi = np.log(min(grid["learning_rate"])), np.log(max(grid["learning_rate"]))
    configs = []
    for _ in range(1000 * s.num_random_trials):  # distinct draws: a repeat would train into the same workdir
      c = {"batch_size": int(rng.choice(grid["batch_size"])),
           "learning_rate": float(f"{np.exp(rng.uniform(lo, hi)):.3g}"),
           "num_epochs": int(rng.choice(grid["num_epochs"]))}
      configs += [c] if c not in configs else []
      if len(configs) == s.num_random_trials:
        break
    else:
      raise failures.UserError(f"sweep.num_random_trials {s.num_random_trials}: the grid's ranges hold fewer "
                               "distinct configurations (learning rates are drawn to 3 significant digits)")
  else:
    raise failures.UserError(f"sweep.mode must be grid or random, got {s.mode!r}")
  return [{**c, "seed": int(seed)} for c in configs for seed in s.seeds]


def _trial_config(config, hp: dict):
  c = config.copy_and_resolve_references()
  with c.unlocked():
    for k, v in hp.items():
      c[k] = v
  return c


def _groups(trials: list[dict], vmap: bool, max_size: int) -> list[list[dict]]:
  """Trials that may train together (same everything but learning rate and seed), in chunks."""
  if not vmap:
    return [[t] for t in trials]
  by_key = {}
  for t in trials:
    by_key.setdefault((t["batch_size"], t["num_epochs"]), []).append(t)
  return [g[i:i + max_size] for g in by_key.values() for i in range(0, len(g), max_size)]


def _read_json(path: str):
  with open(path) as f:
    return json.load(f)


def _write_json(path: str, obj) -> None:
  with atomic_write.replacing(path) as tmp, open(tmp, "w") as f:
    json.dump(obj, f, indent=1)


# ------------------------------------------------------------------------------------------------
# Running.


def _run_group(config, group: list[dict], trial_dir, max_epochs: int | None, log, fresh: bool) -> list[dict]:
  """Trains `group` together; `fresh`: from scratch (else from each trial's `last/` of the rung before)."""
  dirs = [trial_dir(t) for t in group]
  if fresh:
    for d in dirs:  # drop whatever an interrupted attempt left
      shutil.rmtree(d, ignore_errors=True)
  names = [trial_name(t) for t in group]
  log({"event": "start", "trials": names, "max_epochs": max_epochs})
  results = trainer.finetune_trials([_trial_config(config, t) for t in group], dirs, max_epochs=max_epochs,
                                    names=names)
  log({"event": "end", "trials": names, "best": [r["best"] for r in results],
       "diverged": [r.get("diverged_step") for r in results]})
  return results


def _trained_any(workdir: str) -> bool:
  """Whether a trial in `workdir` started training (its task.json, written once its data and checkpoint were read),
  finished or reached a rung: results a run of another config would stand beside, or a sweep still running.
  Without one, the recorded config stands for nothing, and a corrected command takes the workdir."""
  trials = os.path.join(glob.escape(workdir), "trials", "*")
  return any(glob.glob(os.path.join(trials, name)) for name in (DONE, "rung_*.json", task_record.TASK_FILE))


def _in_words(record: dict) -> str:
  """A `sweep_log.jsonl` record as the line the sweep prints."""
  if record["event"] == "start":
    budget = f" to epoch {record['max_epochs']}" if record["max_epochs"] is not None else ""
    return f"training {', '.join(record['trials'])}{budget}"
  if record["event"] == "end":
    def said(name, best, diverged):
      shown = f"{name} best {best:.4g}" if best is not None else f"{name} not evaluated"
      return shown if diverged is None else f"{shown}, diverged at step {diverged}"
    diverged = record.get("diverged") or [None] * len(record["trials"])
    return "; ".join(map(said, record["trials"], record["best"], diverged))
  return f"{record['trial']} pruned after rung {record['rung']}"


def run_sweep(config, workdir: str, check_config: bool = True) -> list[dict]:
  """Runs every unfinished trial of the sweep; returns one row per trial (hyperparameters + results).

  The config is recorded in `<workdir>/sweep_config.json` on the first run, and a later run with another
  one (a changed checkpoint, data or sequence length: finished trials would stand for it) stops, naming
  the fields; the grid, seeds and search may change (`RESULT_FREE`). `check_config` False: the caller
  checks (`bert-jax ablate`, its own record beside).
  """
  config_checks.validate(config, sweep=True)
  trials = make_trials(config)
  if check_config:
    config_record.check_workdir_kind(workdir, "sweep")
  trial_dir = lambda t: os.path.join(workdir, "trials", trial_name(t))
  os.makedirs(os.path.join(workdir, "trials"), exist_ok=True)

  def log(record):
    with open(os.path.join(workdir, "sweep_log.jsonl"), "a") as f:
      f.write(json.dumps({"time": round(time.time(), 1), **record}) + "\n")
    print(f"sweep: {_in_words(record)}", flush=True)

  if check_config:
    record = os.path.join(workdir, CONFIG)
    if os.path.isfile(record) and not _trained_any(workdir):   # say a first attempt stopped on a mistyped path
      os.remove(record)
    config_record.check_same_config(record, config, paths.FINETUNE_FIELDS, ignore=RESULT_FREE)
  is_done = lambda t: os.path.isfile(os.path.join(trial_dir(t), DONE))
  s = config.sweep
  if not s.successive_halving:
    pending = [t for t in trials if not is_done(t)]
    for group in _groups(pending, s.vmap_trials, s.max_trials_per_group):
      for t, r in zip(group, _run_group(config, group, trial_dir, None, log, fresh=True)):
        _write_json(os.path.join(trial_dir(t), DONE), r)
  else:
    _successive_halving(config, trials, trial_dir, is_done, log)
  return [_row(t, trial_dir(t)) for t in trials]


def _successive_halving(config, trials, trial_dir, is_done, log) -> None:
  """Rung r trains the surviving configurations (each with all its seeds) to min_epochs * eta**r epochs;
  the best 1/eta by the mean over their seeds go on. Halving single trials would let one configuration's
  lucky seed outrank a configuration that is better on average."""
  s = config.sweep
  if s.halving_eta < 2 or s.halving_min_epochs < 1:
    raise failures.UserError(f"successive halving needs halving_eta >= 2 and halving_min_epochs >= 1, got "
                             f"{s.halving_eta} and {s.halving_min_epochs}")
  configurations = {}
  for t in trials:
    configurations.setdefault(tuple(t[k] for k in HPARAMS), []).append(t)
  alive = list(configurations)
  for rung in itertools.count():
    budget = s.halving_min_epochs * s.halving_eta ** rung
    marker = lambda t, r=rung: os.path.join(trial_dir(t), f"rung_{r}.json")
    members = [t for c in alive for t in configurations[c]]
    pending = [t for t in members if not is_done(t) and not os.path.isfile(marker(t))]
    for group in _groups(pending, s.vmap_trials, s.max_trials_per_group):
      for t, r in zip(group, _run_group(config, group, trial_dir, budget, log, fresh=rung == 0)):
        _write_json(marker(t), r)
        if r["finished"]:
          _write_json(os.path.join(trial_dir(t), DONE), r)
    if all(is_done(t) for t in members):
      return
    score = lambda t: _trial_score(marker(t), os.path.join(trial_dir(t), DONE))
    ranked = sorted(alive, key=lambda c: float(np.mean([score(t) for t in configurations[c]])), reverse=True)
    keep = max(1, len(alive) // s.halving_eta)
    pruned, alive = ranked[keep:], ranked[:keep]
    for t in (t for c in pruned for t in configurations[c] if not is_done(t)):
      log({"event": "pruned", "trial": trial_name(t), "rung": rung})
    if all(is_done(t) for c in alive for t in configurations[c]):
      return


def _trial_score(marker: str, done: str) -> float:
  """A trial's dev score at a rung: this rung's, else its final one (it finished or stopped early at an
  earlier rung: a seed that stopped does not sink its configuration), else -inf (it never ran)."""
  for path in (marker, done):
    result = _read_json(path) if os.path.isfile(path) else {}
    score = result.get("score", result.get("best"))   # the best so far, an evaluation at the budget included
    if score is not None:
      return score
  return -math.inf


def _row(t: dict, d: str) -> dict:
  """A trial's hyperparameters and final (DONE) or latest-rung results; status done/pruned/missing."""
  if os.path.isfile(os.path.join(d, DONE)):
    return {**t, "status": "done", **_results_fields(_read_json(os.path.join(d, DONE)))}
  rungs = sorted((f for f in os.listdir(d) if f.startswith("rung_")), key=lambda f: int(f[5:-5])) \
      if os.path.isdir(d) else []
  if rungs:
    return {**t, "status": "pruned", **_results_fields(_read_json(os.path.join(d, rungs[-1])))}
  return {**t, "status": "missing"}


def _results_fields(r: dict) -> dict:
  return {"metric": r["primary_metric"], "best": r["best"], "epochs_run": r["epochs"], "seconds": r["seconds"],
          "diverged_step": r.get("diverged_step")}


# ------------------------------------------------------------------------------------------------
# Tables and plot.


def aggregate(rows: list[dict]) -> list[dict]:
  """Mean and sample std of the best dev metric over seeds, per (batch_size, learning_rate, num_epochs),
  best first, of the configurations whose every seed is done. A configuration successive halving pruned
  is left out even where one of its seeds had finished (it stopped early in a rung): ranked on that seed
  alone, the configuration the halving dropped on its mean could come back as the best."""
  out = {}
  for r in rows:
    out.setdefault(tuple(r[k] for k in HPARAMS), []).append(r)
  agg = [{**dict(zip(HPARAMS, k)), "n": len(v), "mean": float(np.mean([r["best"] for r in v])),
          "std": float(np.std([r["best"] for r in v], ddof=1)) if len(v) > 1 else 0.0}
         for k, v in out.items() if all(r["status"] == "done" for r in v)]
  return sorted(agg, key=lambda a: -a["mean"])


def write_tables(rows: list[dict], workdir: str, task: str) -> str:
  """`results.md`, `results.csv` (per configuration), `trials.csv` (per trial); returns the Markdown."""
  agg = aggregate(rows)
  metric = next((r["metric"] for r in rows if "metric" in r), "metric")
  with open(os.path.join(workdir, "trials.csv"), "w", newline="") as f:
    fields = list(HPARAMS) + ["seed", "status", "best", "epochs_run", "seconds", "diverged_step"]
    w = csv.DictWriter(f, fields, extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
  with open(os.path.join(workdir, "results.csv"), "w", newline="") as f:
    w = csv.DictWriter(f, ["task", "metric", *HPARAMS, "n", "mean", "std"])
    w.writeheader()
    w.writerows({"task": task, "metric": metric, **a} for a in agg)
  lines = [f"# Sweep: {task} (dev {metric}, mean +- std over seeds)", "",
           "| batch | lr | epochs | seeds | mean | std |", "|---:|---:|---:|---:|---:|---:|"]
  for i, a in enumerate(agg):
    mark = " **best**" if i == 0 else ""
    lines.append(f"| {a['batch_size']} | {a['learning_rate']:g} | {a['num_epochs']} | {a['n']} | "
                 f"{a['mean']:.4f}{mark} | {a['std']:.4f} |")
  status = {s: sum(r["status"] == s for r in rows) for s in ("done", "pruned", "missing")}
  lines += ["", f"Trials: {status['done']} done, {status['pruned']} stopped by successive halving, "
            f"{status['missing']} not run."]
  diverged = [f"{trial_name(r)} at step {r['diverged_step']}" for r in rows if r.get("diverged_step") is not None]
  if diverged:   # their best evaluations before it count in the means above
    lines += ["", f"Diverged (the loss or parameters not finite; their best evaluation before it counts): "
              f"{', '.join(diverged)}."]
  if agg:
    b = agg[0]
    lines += ["", f"Best for {task}: batch {b['batch_size']}, lr {b['learning_rate']:g}, "
              f"{b['num_epochs']} epochs: {metric} {b['mean']:.4f} +- {b['std']:.4f} (n={b['n']})."]
    seeds = [r for r in rows if r["status"] == "done" and r.get("best") is not None
             and all(r[k] == b[k] for k in HPARAMS)]
    top = max(seeds, key=lambda r: r["best"]) if seeds else None
    top_dir = os.path.join(paths.absolute(workdir), "trials", trial_name(top)) if top else ""
    if top and os.path.isdir(os.path.join(top_dir, "best")):   # kept (keep_best_checkpoint)
      lines += ["", f"Its best seed's finetuned workdir (`bert-jax predict --checkpoint=...`, `export`): "
                f"{top_dir} ({metric} {top['best']:.4f}, seed {top['seed']})."]
  text = "\n".join(lines) + "\n"
  with open(os.path.join(workdir, "results.md"), "w") as f:
    f.write(text)
  return text


def summarize(sweep_dirs: list[str], path: str) -> str:
  """The best configuration per task over several sweeps (their `results.csv`) as Markdown in `path`, a row
  each, named by its directory. A directory without `results.csv` (no sweep, or one that never wrote its tables) is
  a `failures.UserError`, before anything is written."""
  missing = [d for d in sweep_dirs if not os.path.isfile(os.path.join(d, "results.csv"))]
  if missing:
    raise failures.UserError(f"--summarize: {', '.join(missing)} hold{'s' * (len(missing) == 1)} no results.csv: "
                             "give the --workdir of `bert-jax sweep` runs that wrote their tables")
  lines = ["| sweep | task | dev metric | batch | lr | epochs | seeds | mean | std |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|"]
  for d in sweep_dirs:
    with open(os.path.join(d, "results.csv")) as f:
      best = next(csv.DictReader(f), None)  # rows are sorted best first
    if best:
      lines.append(f"| {d} | {best['task']} | {best['metric']} | {best['batch_size']} | "
                   f"{float(best['learning_rate']):g} | {best['num_epochs']} | {best['n']} | {float(best['mean']):.4f} "
                   f"| {float(best['std']):.4f} |")
  text = "\n".join(lines) + "\n"
  with open(path, "w") as f:
    f.write(text)
  return text


def plot_lr(rows: list[dict], path: str, task: str) -> bool:
  """Dev metric against learning rate (log axis), one line per (batch, epochs), error bars = std.

  Needs matplotlib (not a dependency of bert_jax); returns False without it.
  """
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  except ImportError:
    logging.warning("matplotlib is not installed: no %s", path)
    return False
  agg = aggregate(rows)
  fig, ax = plt.subplots(figsize=(6, 4))
  for key in sorted({(a["batch_size"], a["num_epochs"]) for a in agg}):
    pts = sorted((a["learning_rate"], a["mean"], a["std"]) for a in agg
                 if (a["batch_size"], a["num_epochs"]) == key)
    lr, mean, std = zip(*pts)
    ax.errorbar(lr, mean, yerr=std, marker="o", capsize=3, label=f"batch {key[0]}, {key[1]} epochs")
  ax.set_xscale("log")
  ax.set_xlabel("learning rate")
  ax.set_ylabel(f"dev {next((r['metric'] for r in rows if 'metric' in r), '')}")
  ax.set_title(task)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return True


# ------------------------------------------------------------------------------------------------
# Command line.

def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  config = config_loading.load_config(finetune_main.CONFIG, "bert-jax sweep", kind="finetune")
  workdir = finetune_main.WORKDIR.value
  if _SUMMARIZE.value:
    with failures.as_user_errors("bert-jax sweep", failures.UserError, OSError):
      os.makedirs(workdir, exist_ok=True)
      print(summarize(_SUMMARIZE.value, os.path.join(workdir, "summary.md")))
    return
  if config is None:
    raise app.UsageError("--config is required (unless --summarize)")
  with failures.as_user_errors("bert-jax sweep", FileNotFoundError), \
       failures.stop_message("bert-jax sweep", "the finished trials are kept: the same command runs the others "
                             "(a trial that did not finish starts over)"):
    rows = run_sweep(config, workdir)
  print(write_tables(rows, workdir, config.task))
  plot_lr(rows, os.path.join(workdir, "lr.png"), config.task)


if __name__ == "__main__":
  cli.run_module(main, "bert-jax sweep")

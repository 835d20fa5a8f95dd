"""`bert-jax sweep`: trial lists, grouping, tables; and a real sweep killed mid-way and resumed."""

import json
import os
import subprocess
import sys
import time

import pytest

from bert_jax.finetune import config_checks
from bert_jax.finetune import sweep
from conftest import REPO_ROOT
from test_finetune_train import make_sentiment_data, tiny_config
from configs.finetune import sst2


def test_default_grid_is_the_papers_with_every_seed():
  config = sst2.get_config()
  trials = sweep.make_trials(config)
  assert len(trials) == 2 * 3 * 3 * 3  # batch x lr x epochs (Devlin et al. 2019, A.3) x seeds
  assert {t["batch_size"] for t in trials} == {16, 32}
  assert {t["learning_rate"] for t in trials} == {5e-5, 3e-5, 2e-5}
  assert len({sweep.trial_name(t) for t in trials}) == len(trials)
  groups = sweep._groups(trials, vmap=True, max_size=4)
  assert sorted(sweep.trial_name(t) for g in groups for t in g) == sorted(sweep.trial_name(t) for t in trials)
  for g in groups:
    assert len(g) <= 4 and len({(t["batch_size"], t["num_epochs"]) for t in g}) == 1


def test_random_search_samples_inside_the_grid_ranges():
  config = sst2.get_config()
  config.sweep.mode, config.sweep.num_random_trials, config.sweep.seeds = "random", 5, (0, 1)
  trials = sweep.make_trials(config)
  assert len(trials) == 10
  assert all(2e-5 <= t["learning_rate"] <= 5e-5 and t["batch_size"] in (16, 32) for t in trials)
  assert trials == sweep.make_trials(config)  # reproducible from sweep.random_seed


def test_random_search_draws_distinct_configurations():
  """Seed 100 drew one configuration twice among 20: both copies trained into one workdir."""
  config = sst2.get_config()
  config.sweep.mode, config.sweep.num_random_trials, config.sweep.seeds = "random", 20, (0,)
  config.sweep.random_seed = 100
  names = [sweep.trial_name(t) for t in sweep.make_trials(config)]
  assert len(names) == 20 and len(set(names)) == 20
  config.sweep.grid.batch_size, config.sweep.grid.num_epochs, config.sweep.grid.learning_rate = (16,), (2,), (2e-5,)
  config.sweep.num_random_trials = 2
  with pytest.raises(ValueError, match="fewer distinct"):
    sweep.make_trials(config)


def _fake_trials(score, stops=()):
  """`trainer.finetune_trials` without training: dev score `score[(lr, seed)]`; a trial in `stops` stops
  early (done) in its first call."""
  def finetune_trials(configs, workdirs, max_epochs=None, names=None):
    for w in workdirs:
      os.makedirs(w, exist_ok=True)
    return [{"primary_metric": "accuracy", "best": score[(c.learning_rate, c.seed)], "seconds": 0.0,
             "epochs": min(max_epochs or c.num_epochs, c.num_epochs),
             "finished": (c.learning_rate, c.seed) in stops or max_epochs is None or max_epochs >= c.num_epochs}
            for c in configs]
  return finetune_trials


def _halving_config(learning_rates, seeds, epochs):
  c = sst2.get_config()
  c.sweep.grid.batch_size, c.sweep.grid.num_epochs, c.sweep.grid.learning_rate = (16,), (epochs,), learning_rates
  c.sweep.seeds = seeds
  c.sweep.successive_halving, c.sweep.halving_eta, c.sweep.halving_min_epochs = True, 2, 1
  return c


def test_successive_halving_ranks_configurations_by_their_mean_over_seeds(tmp_path, monkeypatch):
  """Configuration A (0.80, 0.80, 0.95) has a lucky seed; B (0.90 each) is better on average: B goes on,
  with all its seeds, and A stops, all of its seeds."""
  score = {(3e-5, 0): 0.80, (3e-5, 1): 0.80, (3e-5, 2): 0.95, (2e-5, 0): 0.90, (2e-5, 1): 0.90, (2e-5, 2): 0.90}
  monkeypatch.setattr(sweep.trainer, "finetune_trials", _fake_trials(score))
  rows = sweep.run_sweep(_halving_config((3e-5, 2e-5), (0, 1, 2), 3), str(tmp_path))
  assert {(r["learning_rate"], r["seed"]): r["status"] for r in rows} == {
      (2e-5, s): "done" for s in (0, 1, 2)} | {(3e-5, s): "pruned" for s in (0, 1, 2)}
  [best] = sweep.aggregate(rows)
  assert best["learning_rate"] == 2e-5 and best["n"] == 3


def test_the_sweep_says_what_it_trains_and_prunes(tmp_path, monkeypatch, capsys):
  score = {(3e-5, 0): 0.80, (2e-5, 0): 0.90}
  monkeypatch.setattr(sweep.trainer, "finetune_trials", _fake_trials(score))
  sweep.run_sweep(_halving_config((3e-5, 2e-5), (0,), 2), str(tmp_path))
  a, b = "bs16_lr3e-05_ep2_seed0", "bs16_lr2e-05_ep2_seed0"
  assert capsys.readouterr().out.splitlines() == [
      f"sweep: training {a}, {b} to epoch 1", f"sweep: {a} best 0.8; {b} best 0.9", f"sweep: {a} pruned after rung 0",
      f"sweep: training {b} to epoch 2", f"sweep: {b} best 0.9"]
  end = {"event": "end", "trials": [a, b], "best": [None, 0.9], "diverged": [4, None]}
  said = sweep._in_words(end)  # pylint: disable=protected-access
  assert said == f"{a} not evaluated, diverged at step 4; {b} best 0.9"


def test_a_seed_that_stopped_early_keeps_its_configuration_s_score(tmp_path, monkeypatch):
  """The best configuration's seed 1 stops early in the first rung: its final score stands for it later."""
  lrs = (4e-5, 3e-5, 2e-5, 1e-5)
  score = {(lr, seed): {4e-5: 0.6, 3e-5: 0.8, 2e-5: 0.9, 1e-5: 0.7}[lr] for lr in lrs for seed in (0, 1)}
  monkeypatch.setattr(sweep.trainer, "finetune_trials", _fake_trials(score, stops={(2e-5, 1)}))
  rows = sweep.run_sweep(_halving_config(lrs, (0, 1), 4), str(tmp_path))
  assert {r["seed"]: r["epochs_run"] for r in rows if r["learning_rate"] == 2e-5} == {0: 4, 1: 1}
  assert all(r["status"] == "done" for r in rows if r["learning_rate"] == 2e-5)


def test_a_pruned_configuration_is_not_best_on_the_seed_that_stopped_early(tmp_path, monkeypatch):
  """3e-5 (0.95 and 0.40: its 0.95 seed stopped early in the first rung, done) loses on its mean and is
  pruned; 2e-5 (0.85 each) goes on alone: it is the best, not 3e-5 on its one finished seed."""
  score = {(3e-5, 0): 0.95, (3e-5, 1): 0.40, (2e-5, 0): 0.85, (2e-5, 1): 0.85, (1e-5, 0): 0.5, (1e-5, 1): 0.5}
  monkeypatch.setattr(sweep.trainer, "finetune_trials", _fake_trials(score, stops={(3e-5, 0)}))
  rows = sweep.run_sweep(_halving_config((3e-5, 2e-5, 1e-5), (0, 1), 3), str(tmp_path))
  assert {(r["learning_rate"], r["seed"]): r["status"] for r in rows if r["learning_rate"] == 3e-5} == {
      (3e-5, 0): "done", (3e-5, 1): "pruned"}
  [best] = sweep.aggregate(rows)
  assert best["learning_rate"] == 2e-5 and best["n"] == 2
  table = sweep.write_tables(rows, str(tmp_path), "sst2")
  assert "| 16 | 2e-05 | 3 | 2 | 0.8500 **best** |" in table and "finetuned workdir" not in table   # none kept
  (tmp_path / "trials" / "bs16_lr2e-05_ep3_seed0" / "best").mkdir()
  table = sweep.write_tables(rows, str(tmp_path), "sst2")
  assert (f"finetuned workdir (`bert-jax predict --checkpoint=...`, `export`): {tmp_path}/trials/bs16_lr2e-05_ep3_seed0 "
          "(accuracy 0.8500, seed 0)") in table, table
  assert "Diverged" not in table
  rows[0]["diverged_step"] = 12
  table = sweep.write_tables(rows, str(tmp_path), "sst2")
  assert f"Diverged (the loss or parameters not finite; their best evaluation before it counts): " \
         f"{sweep.trial_name(rows[0])} at step 12." in table
  assert (tmp_path / "trials.csv").read_text().splitlines()[0].endswith(",diverged_step")


def test_a_sweep_run_again_with_another_config_stops(tmp_path, monkeypatch):
  """Finished trials stand for the config they ran with: another checkpoint or sequence length stops the
  sweep, naming the fields; more learning rates or seeds extend it."""
  from bert_jax import failures  # pylint: disable=g-import-not-at-top
  score = {(lr, seed): 0.5 for lr in (3e-5, 2e-5) for seed in (0, 1)}
  monkeypatch.setattr(sweep.trainer, "finetune_trials", _fake_trials(score))
  c = sst2.get_config()
  c.sweep.grid.batch_size, c.sweep.grid.num_epochs, c.sweep.grid.learning_rate = (16,), (2,), (3e-5,)
  c.sweep.seeds, c.init_checkpoint = (0,), "runs/a"
  assert len(sweep.run_sweep(c, str(tmp_path))) == 1
  c.sweep.grid.learning_rate, c.sweep.seeds = (3e-5, 2e-5), (0, 1)
  assert len(sweep.run_sweep(c, str(tmp_path))) == 4
  for field, value in (("init_checkpoint", "runs/b"), ("max_seq_length", 64)):
    changed = c.copy_and_resolve_references()
    changed[field] = value
    with pytest.raises(failures.UserError, match=f"another config.*{field}"):
      sweep.run_sweep(changed, str(tmp_path))


def test_a_sweep_that_trained_nothing_takes_a_corrected_command(tmp_path, monkeypatch):
  """A first attempt stopped on a mistyped data_dir before any trial trained: the same workdir takes the corrected
  command. Once a trial finished, another data_dir stops it."""
  from bert_jax import failures  # pylint: disable=g-import-not-at-top

  def mistyped(configs, workdirs, max_epochs=None, names=None):
    raise failures.UserError(f"{configs[0].data_dir} does not exist")

  c = sst2.get_config()
  c.sweep.grid.batch_size, c.sweep.grid.num_epochs, c.sweep.grid.learning_rate = (16,), (2,), (3e-5,)
  c.sweep.seeds, c.init_checkpoint, c.data_dir = (0,), "runs/a", "data/rotten_tomato"
  monkeypatch.setattr(sweep.trainer, "finetune_trials", mistyped)
  with pytest.raises(failures.UserError, match="does not exist"):
    sweep.run_sweep(c, str(tmp_path))
  monkeypatch.setattr(sweep.trainer, "finetune_trials", _fake_trials({(3e-5, 0): 0.5}))
  c.data_dir = "data/rotten_tomatoes"
  assert [r["status"] for r in sweep.run_sweep(c, str(tmp_path))] == ["done"]
  c.data_dir = "data/other"
  with pytest.raises(failures.UserError, match="another config.*data_dir"):
    sweep.run_sweep(c, str(tmp_path))


def test_aggregate_mean_and_std_over_seeds():
  rows = [{"batch_size": 16, "learning_rate": 1e-3, "num_epochs": 2, "seed": s, "status": "done", "best": b}
          for s, b in ((0, 0.8), (1, 0.9))]
  rows.append({"batch_size": 16, "learning_rate": 3e-3, "num_epochs": 2, "seed": 0, "status": "pruned",
               "best": 0.99})
  [agg] = sweep.aggregate(rows)  # pruned trials do not count
  assert agg["n"] == 2 and agg["mean"] == pytest.approx(0.85) and agg["std"] == pytest.approx(0.0707, abs=1e-4)


def sweep_test_config(data_dir: str):
  """4 trials (2 learning rates x 2 seeds), 2 per vmapped group, successive halving with eta 2."""
  c = tiny_config(data_dir)
  c.model.num_layers, c.model.hidden_size, c.model.num_heads, c.model.intermediate_size = 1, 32, 2, 64
  c.sweep.grid.batch_size, c.sweep.grid.num_epochs = (16,), (2,)
  c.sweep.grid.learning_rate = (1e-3, 3e-3)
  c.sweep.seeds = (0, 1)
  c.sweep.max_trials_per_group = 2
  c.sweep.successive_halving, c.sweep.halving_eta, c.sweep.halving_min_epochs = True, 2, 1
  return c


def _events(workdir):
  with open(os.path.join(workdir, "sweep_log.jsonl")) as f:
    return [json.loads(line) for line in f]


def _stamp(path):
  return os.stat(path).st_mtime_ns, open(path).read()


@pytest.mark.slow
def test_sweep_killed_midway_resumes_without_rerunning_finished_trials(tmp_path, capsys):
  data_dir = make_sentiment_data(tmp_path / "data", n_train=64, n_dev=32)
  config_file = tmp_path / "sweep_config.py"
  config_file.write_text(f"import sys\nsys.path.insert(0, {str(REPO_ROOT / 'tests')!r})\n"
                         "from test_sweep import sweep_test_config\n\n\n"
                         f"def get_config():\n  return sweep_test_config({data_dir!r})\n")
  workdir = str(tmp_path / "sweep")
  proc = subprocess.Popen([sys.executable, "-m", "bert_jax.cli", "sweep", f"--config={config_file}",
                           f"--workdir={workdir}"], cwd=REPO_ROOT, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  try:
    deadline = time.time() + 600
    while not (os.path.exists(os.path.join(workdir, "sweep_log.jsonl"))
               and any(e["event"] == "end" for e in _events(workdir))):
      assert proc.poll() is None and time.time() < deadline, "the sweep ended before its first group did"
      time.sleep(0.2)
  finally:
    proc.kill()  # SIGKILL: no cleanup, as a preempted machine
    proc.wait()
  first = next(e for e in _events(workdir) if e["event"] == "end")["trials"]
  markers = {t: os.path.join(workdir, "trials", t, "rung_0.json") for t in first}
  before = {t: _stamp(m) for t, m in markers.items()}
  assert not os.path.exists(os.path.join(workdir, "results.md"))

  config = sweep_test_config(data_dir)
  capsys.readouterr()
  logged_before = len(_events(workdir))
  rows = sweep.run_sweep(config, workdir)
  # Every trial of a group trained together prints its progress, each line after its name.
  printed = capsys.readouterr().out.splitlines()
  names = {sweep.trial_name(r) for r in rows}
  progress = [line for line in printed if " step " in line or line.startswith("step ")]
  assert progress and all(line.split("] ")[0].lstrip("[") in names for line in progress), printed
  trained = {t for e in _events(workdir)[logged_before:] if e["event"] == "start" for t in e["trials"]}
  assert {line.split("] ")[0].lstrip("[") for line in progress} == trained and len(trained) > 1, printed
  assert any(line.startswith("sweep: training ") for line in printed), printed
  sweep.write_tables(rows, workdir, config.task)
  assert sweep.plot_lr(rows, os.path.join(workdir, "lr.png"), config.task) == (
      __import__("importlib").util.find_spec("matplotlib") is not None)

  # The first group's rung 0 was not run again, and nothing else either: one start per (group, rung).
  assert {t: _stamp(m) for t, m in markers.items()} == before
  starts = [(tuple(e["trials"]), e["max_epochs"]) for e in _events(workdir) if e["event"] == "start"]
  assert sum(t in trials for trials, budget in starts for t in first if budget == 1) == 2
  assert sorted(r["status"] for r in rows) == ["done", "done", "pruned", "pruned"]
  done = [r for r in rows if r["status"] == "done"]
  assert all(r["epochs_run"] == 2 for r in done)
  # The survivors continued from their rung-0 state: epoch-2 evaluation at step 8, no second step-4 one.
  for r in done:
    log = open(os.path.join(workdir, "trials", sweep.trial_name(r), "metrics.jsonl")).read().splitlines()
    assert [json.loads(x)["step"] for x in log if "eval/accuracy" in x] == [4, 8]
  table = open(os.path.join(workdir, "results.md")).read()
  assert "| 16 |" in table and "**best**" in table and "2 done, 2 stopped by successive halving" in table
  assert len(open(os.path.join(workdir, "trials.csv")).read().splitlines()) == 5
  summary = sweep.summarize([workdir], str(tmp_path / "summary.md")).splitlines()
  assert len(summary) == 3 and summary[2].startswith(f"| {workdir} | sst2 | accuracy | 16 |")


def test_a_sweep_field_out_of_range_is_named_before_anything_runs(tmp_path):
  from bert_jax import failures  # pylint: disable=g-import-not-at-top
  for field, value in (("max_trials_per_group", 0), ("grid.learning_rate", ()), ("grid.batch_size", (16, 0)),
                       ("seeds", ()), ("seeds", (0, 0, 1)), ("grid.learning_rate", (5e-5, 1e-3, 5e-5))):
    c = sst2.get_config()
    node, name = (c.sweep.grid, field.split(".")[1]) if "." in field else (c.sweep, field)
    node[name] = value
    with pytest.raises(failures.UserError, match=rf"sweep.{field} .*--config.sweep.{field}\)"):
      sweep.run_sweep(c, str(tmp_path / "sweep"))
  assert not (tmp_path / "sweep").exists()
  c = sst2.get_config()   # seeds that differ past a float's sixth digit are different seeds
  c.sweep.seeds = (20240101, 20240102)
  assert not config_checks.sweep_problems(c)


def test_summarize_names_each_sweep_and_refuses_a_directory_without_results(tmp_path):
  from bert_jax import failures  # pylint: disable=g-import-not-at-top
  rows = [{"batch_size": 16, "learning_rate": 2e-5, "num_epochs": 3, "seed": s, "status": "done", "best": b}
          for s, b in ((0, 0.8), (1, 0.9))]
  for name in ("a", "b"):
    (tmp_path / name).mkdir()
    sweep.write_tables(rows, str(tmp_path / name), "sst2")
  text = sweep.summarize([str(tmp_path / "a"), str(tmp_path / "b")], str(tmp_path / "summary.md"))
  assert f"| {tmp_path / 'a'} | sst2 | metric | 16 | 2e-05 | 3 | 2 | 0.8500 |" in text, text
  assert f"| {tmp_path / 'b'} | sst2 |" in text
  with pytest.raises(failures.UserError, match=r"nothere holds no results.csv"):
    sweep.summarize([str(tmp_path / "a"), str(tmp_path / "nothere")], str(tmp_path / "again.md"))
  assert not (tmp_path / "again.md").exists()

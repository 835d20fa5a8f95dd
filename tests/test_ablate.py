"""`bert-jax ablate`: Welch's test against scipy, the configs of every table at every scale, the tables and
plot from finished runs, and a kill in the middle of a tiny ablation: the re-run redoes nothing finished
and writes the tables an uninterrupted run writes."""

import csv
import importlib
import math
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import compilation_cache_env
from bert_jax import failures
from bert_jax import objectives
from bert_jax import train
from bert_jax.ablate import main as ablate_main
from bert_jax.ablate import report
from bert_jax.ablate import runner
from bert_jax.ablate import stats
from configs.ablations import common as ablation_common
from test_train import compilation_cache, data_dir  # noqa: F401  (fixtures: the JAX cache, a prepared corpus)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLES = ("devlin_table5", "devlin_table6", "roberta_table1", "roberta_table2", "spanbert", "electra", "albert", "albert_table4")


def table(name: str, scale: str):
  return importlib.import_module(f"configs.ablations.{name}").get_config(scale)


# ------------------------------------------------------------------------------------------------
# Statistics.


def test_welch_t_test_matches_a_hand_computed_value():
  # a: mean 2, sample variance 1; b: mean 5, sample variance 4 (n = 3 each).
  # t = -3 / sqrt(1/3 + 4/3) = -2.3238; df = (5/3)^2 / ((1/3)^2 / 2 + (4/3)^2 / 2) = 2.9412.
  # For df = 2.9412, P(|T| >= 2.3238) = 0.1048 (the t distribution's CDF, integrated numerically below).
  w = stats.welch_t_test([1.0, 2.0, 3.0], [3.0, 5.0, 7.0])
  assert w.t == pytest.approx(-3 / math.sqrt(5 / 3))
  assert w.df == pytest.approx((5 / 3) ** 2 / ((1 / 9) / 2 + (16 / 9) / 2))
  x = np.linspace(abs(w.t), 2000.0, 2_000_001)
  density = math.gamma((w.df + 1) / 2) / (math.sqrt(w.df * math.pi) * math.gamma(w.df / 2)) * \
      (1 + x ** 2 / w.df) ** (-(w.df + 1) / 2)
  tail = float(np.sum((density[1:] + density[:-1]) / 2 * np.diff(x)))
  assert w.p == pytest.approx(2 * tail, abs=1e-4)
  assert not w.significant


def test_welch_t_test_matches_scipy():
  scipy_stats = pytest.importorskip("scipy.stats")
  rng = np.random.default_rng(0)
  for n1, n2, shift, scale in [(2, 2, 0.5, 1.0), (3, 5, 1.0, 3.0), (5, 3, 4.0, 0.5), (10, 4, 0.1, 1.0), (3, 3, 30.0, 1.0)]:
    a, b = rng.normal(0, 1, n1), rng.normal(shift, scale, n2)
    ours, theirs = stats.welch_t_test(a, b), scipy_stats.ttest_ind(a, b, equal_var=False)
    assert ours.t == pytest.approx(theirs.statistic, rel=1e-10)
    assert ours.p == pytest.approx(theirs.pvalue, rel=1e-8, abs=1e-14)
  for t, df in [(0.0, 1.0), (0.3, 1.5), (2.0, 7.3), (12.0, 3.0), (1e-4, 200.0), (4.0, 5000.0)]:
    assert stats.student_t_two_sided_p(t, df) == pytest.approx(2 * scipy_stats.t.sf(t, df), rel=1e-8, abs=1e-14)


def test_welch_t_test_degenerate_cases():
  assert math.isnan(stats.welch_t_test([1.0], [2.0, 3.0]).p)   # one seed: no test
  assert stats.welch_t_test([1.0, 1.0], [1.0, 1.0]).p == 1.0
  assert stats.welch_t_test([1.0, 1.0], [2.0, 2.0]).significant
  assert stats.mean_std([1.0, 2.0, 3.0]) == (2.0, 1.0) and stats.mean_std([4.0]) == (4.0, 0.0)


# ------------------------------------------------------------------------------------------------
# Configs.


@pytest.mark.parametrize("name", TABLES)
def test_every_variant_of_every_scale_is_a_valid_pretraining_config(name):
  for scale in ablation_common.SCALES:
    ablation = table(name, scale)
    configs = runner.variant_configs(ablation)
    assert list(configs) == [v.name for v in ablation.variants] and len(configs) >= 2
    for c in configs.values():
      train.validate(c, num_devices=32 if scale == "paper" else 8)
      assert c.eval_steps > 0   # the held-out metric comes from the final evaluation
    assert set(ablation.tasks) <= set(dict(ablation.paper.columns))   # every task run has the paper's column
    for v in ablation.variants:   # every mapped column has a published number
      assert all(v.paper.get(col) is not None for m, col in ablation.paper.columns.items() if m in ablation.tasks)
    if ablation.budget.kind == "tokens":
      assert len({runner.pretrain_tokens(c) for c in configs.values()}) == 1
    elif ablation.budget.kind == "steps":
      ref, ratios = configs[ablation.budget.reference].train_steps, dict(ablation.budget.step_ratios)
      assert ratios and all(c.train_steps == round(ref * ratios.get(n, 1.0)) == c.optimizer.total_steps
                            for n, c in configs.items())
    else:
      flops = [objectives.train_flops_per_step(c) * c.train_steps for c in configs.values()]
      per_step = max(objectives.train_flops_per_step(c) for c in configs.values())
      assert max(flops) - min(flops) <= per_step   # equal up to one step
  with pytest.raises(ValueError, match="scale"):
    table(name, "huge")


def test_electra_trains_the_mlm_run_the_papers_steps_and_a_flops_budget_matches_flops():
  """ELECTRA's Table 1 budget is the paper's steps (BERT-Small 1.5M to ELECTRA-Small's 1M); a "flops"
  budget spends equal FLOPs by bert_jax/flops.py's count instead."""
  configs = runner.variant_configs(table("electra", "paper"))
  assert (configs["electra_small"].train_steps, configs["bert_small"].train_steps) == (1_000_000, 1_500_000)
  ablation = table("electra", "small")
  ablation.budget.kind = "flops"
  configs = runner.variant_configs(ablation)
  flops = [objectives.train_flops_per_step(c) * c.train_steps for c in configs.values()]
  assert max(flops) - min(flops) <= max(objectives.train_flops_per_step(c) for c in configs.values())
  ablation.budget.kind, ablation.budget.step_ratios = "steps", {"bert_smal": 1.5}
  with pytest.raises(ValueError, match="names no variant"):
    runner.variant_configs(ablation)


def test_override_of_a_missing_nested_field_is_an_error():
  c = table("devlin_table5", "tiny").base.copy_and_resolve_references()
  with pytest.raises(KeyError, match="no such field"):
    runner.set_field(c, "data.fromat", "nsp")


# ------------------------------------------------------------------------------------------------
# Tables and plot, from markers written by hand.


def _fake_run(ablation, workdir, scores: dict, heldout: dict, parameters: dict) -> None:
  for v in ablation.variants:
    vdir = os.path.join(workdir, v.name)
    os.makedirs(os.path.join(vdir, "finetune", "sst2"))
    runner.write_marker(os.path.join(vdir, runner.PRETRAINED), {"parameters": parameters[v.name], "tokens": 100,
                                                                 "flops": 1e9, "train_steps": 6})
    runner.write_marker(os.path.join(vdir, runner.EVALUATED), {v.heldout_metric: heldout[v.name]})
    if v.name in scores:
      runner.write_marker(os.path.join(vdir, "finetune", "sst2", runner.FINETUNED),
                          {"task": "sst2", "metric": "accuracy", "seeds": [0, 1, 2], "scores": scores[v.name]})


def test_tables_and_bar_plot_from_markers(tmp_path):
  ablation = table("devlin_table5", "tiny")
  scores = {"mlm_nsp": [0.80, 0.82, 0.81], "no_nsp": [0.76, 0.78, 0.77]}   # ltr_no_nsp: not finetuned yet
  _fake_run(ablation, str(tmp_path), scores, {"mlm_nsp": 12.5, "no_nsp": 14.0, "ltr_no_nsp": 30.0},
            {v.name: 1000 for v in ablation.variants})
  text = ablate_main.run_and_report(ablation, str(tmp_path), train=False)
  assert "| MLM + NSP (BERT) | 1000 | 81.00 ± 1.00 (n=3) | 92.7 |" in text
  p = stats.welch_t_test([76, 78, 77], [80, 82, 81]).p
  assert 0.001 < p < 0.05
  assert f"| No NSP | 1000 | 77.00 ± 1.00 (n=3) | 92.6 | -4.00 | {p:.3f} | yes | -0.1 | yes |" in text
  assert "| LTR & No NSP | 1000 | not run |" in text
  # Each objective's own held-out metric; differences only between the same metric, untested (one run).
  assert "| LTR & No NSP | 1000 | 6 | 100 | 1e+09 | eval/lm_perplexity (lower is better) | 30.00 (n=1) | - | - |" in text
  assert "| No NSP | 1000 | 6 | 100 | 1e+09 | eval/mlm_perplexity (lower is better) | 14.00 (n=1) | - | 1.50 | - | untested (n=1) |" in text
  with open(tmp_path / "results.csv") as f:
    rows = list(csv.DictReader(f))
  sst2 = {r["variant"]: r for r in rows if r["measurement"] == "sst2"}
  assert float(sst2["no_nsp"]["mean"]) == pytest.approx(77.0) and sst2["no_nsp"]["exceeds_seed_variation"] == "True"
  assert float(sst2["no_nsp"]["p_value"]) == pytest.approx(p) and sst2["mlm_nsp"]["delta"] == ""
  heldout = {r["variant"]: r for r in rows if r["measurement"] == "heldout"}
  assert heldout["no_nsp"]["delta"] == "1.5" and heldout["ltr_no_nsp"]["delta"] == ""   # not the same metric
  assert (tmp_path / "results.png").stat().st_size > 1000


def test_a_tie_is_no_ordering(tmp_path):
  ablation = table("devlin_table5", "tiny")
  scores = {"mlm_nsp": [0.80, 0.82, 0.81], "no_nsp": [0.76, 0.78, 0.77], "ltr_no_nsp": [0.81, 0.80, 0.82]}
  _fake_run(ablation, str(tmp_path), scores, {v.name: 10.0 for v in ablation.variants},
            {v.name: 1000 for v in ablation.variants})
  text = ablate_main.run_and_report(ablation, str(tmp_path), train=False)
  assert "| LTR & No NSP | 1000 | 81.00 ± 1.00 (n=3) | 92.1 | 0.00 | 1.000 | no | -0.6 | tie |" in text
  # mlm_nsp > no_nsp as in the paper; no_nsp < ltr_no_nsp against it; the tied pair is left out.
  assert "Pairs of variants ordered as in the paper: 1 of 2 (ties left out)" in text


def test_a_finished_workdir_is_not_rerun_and_refuses_another_config(tmp_path):
  ablation = table("devlin_table5", "tiny")
  _fake_run(ablation, str(tmp_path), {v.name: [0.5, 0.6, 0.7] for v in ablation.variants},
            {v.name: 10.0 for v in ablation.variants}, {v.name: 1000 for v in ablation.variants})
  before = _finished_files(str(tmp_path))
  text = ablate_main.run_and_report(ablation, str(tmp_path))   # every stage has its marker: nothing runs
  assert _finished_files(str(tmp_path)) == before and "60.00 ± 10.00 (n=3)" in text
  for field, value in (("tasks.sst2.sweep.seeds", (0, 1, 2, 3)), ("base.optimizer.learning_rate", 1e-3)):
    changed = table("devlin_table5", "tiny")
    runner.set_field(changed, field, value)
    with pytest.raises(failures.UserError, match=field.split(".", 2)[-1].replace("sst2.", "")):
      ablate_main.run_and_report(changed, str(tmp_path))


def test_variants_run_apart_or_reported_later_must_share_one_config(tmp_path):
  """One process recorded variant mlm_nsp with the table's config; another that runs the other variants
  (`--variants`) or reports (`--report_only`) with another base or task config stops before anything
  runs, instead of putting two experiments in one table."""
  ablation = table("devlin_table5", "tiny")
  runner.set_field(ablation, "tasks.sst2.data_dir", REPO)   # there (what it holds is not read here)
  runner.set_field(ablation, "base.data.train_files", "embedded:shakespeare")
  first, second = (v.name for v in ablation.variants[:2])
  runner.check_configs(ablation, str(tmp_path), run=[first])
  assert sorted(os.listdir(tmp_path)) == [first]
  runner.check_configs(ablation, str(tmp_path), run=[second])   # the same config: fine
  for field, value in (("base.optimizer.learning_rate", 1e-3), ("tasks.sst2.learning_rate", 3e-3)):
    changed = table("devlin_table5", "tiny")
    runner.set_field(changed, "tasks.sst2.data_dir", REPO)
    runner.set_field(changed, "base.data.train_files", "embedded:shakespeare")
    runner.set_field(changed, field, value)
    with pytest.raises(failures.UserError, match=f"{first}(/finetune/sst2)? holds a run of another config"):
      runner.run(changed, str(tmp_path), only=[v.name for v in ablation.variants[2:]])
    with pytest.raises(failures.UserError, match="holds a run of another config"):
      ablate_main.run_and_report(changed, str(tmp_path), train=False)
  assert sorted(os.listdir(tmp_path)) == [first, second]
  # A report reads no data: data paths its command leaves unset match the recorded ones; one set elsewhere does not.
  unset = table("devlin_table5", "tiny")
  ablate_main.run_and_report(unset, str(tmp_path), train=False)
  runner.set_field(unset, "base.data.train_files", "embedded:shakespeare")   # the task's data_dir alone unset
  with pytest.raises(failures.UserError, match="data_dir differ"):
    runner.check_configs(unset, str(tmp_path), run=[first])   # a run compares them, set or not
  runner.set_field(unset, "tasks.sst2.data_dir", str(tmp_path))
  with pytest.raises(failures.UserError, match="data_dir differ"):
    ablate_main.run_and_report(unset, str(tmp_path), train=False)


def test_a_task_s_data_dir_unset_or_not_there_stops_the_table_before_anything_runs_or_is_recorded(
    tmp_path, data_dir):  # noqa: F811  (the fixture)
  ablation = table("devlin_table5", "tiny")
  with pytest.raises(failures.UserError, match=r"tasks.sst2.data_dir is not set: set --config.tasks.sst2.data_dir"):
    runner.run(ablation, str(tmp_path / "unset"))
  runner.set_field(ablation, "tasks.sst2.data_dir", str(tmp_path / "rotten_tomatos"))
  with pytest.raises(failures.UserError, match=r"rotten_tomatos does not exist: set --config.tasks.sst2.data_dir"):
    runner.run(ablation, str(tmp_path / "typo"))
  assert not (tmp_path / "unset").exists() and not (tmp_path / "typo").exists()   # nothing recorded
  # The pretraining corpus mistyped: stopped before anything is recorded, named as the command line sets it.
  runner.set_field(ablation, "tasks.sst2.data_dir", str(tmp_path))
  runner.set_field(ablation, "base.data.train_files", str(tmp_path / "prepared" / "nwes"))
  with pytest.raises(failures.UserError, match=r"variant mlm_nsp's pretraining config .*\n  data.train_files "
                                               r"'[^']*/prepared/nwes' holds no prepared shards"):
    runner.run(ablation, str(tmp_path / "corpus"))
  assert not (tmp_path / "corpus").exists()
  # A vocabulary larger than the model's table: stopped before anything is recorded, and the field to set is
  # named as this command line sets it (a first version said --config.model.vocab_size, which ablate refuses).
  runner.set_field(ablation, "base.data.train_files", data_dir)   # prepared with a vocabulary of 128
  runner.set_field(ablation, "base.model.vocab_size", 64)
  with pytest.raises(failures.UserError, match=r"variant mlm_nsp's pretraining config .*: the tokenizer of .* has "
                                               r"\d+ tokens but .* set --config.base.model.vocab_size=\d+ "):
    runner.run(ablation, str(tmp_path / "vocab"))
  assert not (tmp_path / "vocab").exists()
  # The same vocabulary given for the embedded corpus, which is then tokenized with it: checked the same way.
  runner.set_field(ablation, "base.data.train_files", "embedded:shakespeare")
  runner.set_field(ablation, "base.data.vocab_file", os.path.join(data_dir, "vocab.txt"))
  with pytest.raises(failures.UserError, match=r"variant mlm_nsp's pretraining config .*: the tokenizer of .* has "
                                               r"\d+ tokens but .* set --config.base.model.vocab_size=\d+ "):
    runner.run(ablation, str(tmp_path / "embedded_vocab"))
  assert not (tmp_path / "embedded_vocab").exists()
  runner.set_field(ablation, "base.data.vocab_file", "")
  runner.set_field(ablation, "base.data.train_files", data_dir)
  runner.set_field(ablation, "base.model.vocab_size", table("devlin_table5", "tiny").base.model.vocab_size)
  # A task's field out of range: named as this command line sets it, before anything runs or is recorded.
  runner.set_field(ablation, "tasks.sst2.learning_rate", 0.0)
  with pytest.raises(failures.UserError, match=r"invalid config of task sst2:\n  learning_rate 0.0: above 0 "
                                               r"\(--config.tasks.sst2.learning_rate\)"):
    runner.run(ablation, str(tmp_path / "task"))
  assert not (tmp_path / "task").exists()
  # Every variant finetuned already: the task's data is not read again, wherever it has gone.
  _fake_run(ablation, str(tmp_path / "done"), {v.name: [0.5, 0.6, 0.7] for v in ablation.variants},
            {v.name: 10.0 for v in ablation.variants}, {v.name: 1000 for v in ablation.variants})
  runner.check_task_data(ablation, str(tmp_path / "done"), [v.name for v in ablation.variants])


def test_another_table_in_a_table_s_workdir_stops_even_its_report(tmp_path):
  ablation = table("devlin_table5", "tiny")
  _fake_run(ablation, str(tmp_path), {v.name: [0.5, 0.6, 0.7] for v in ablation.variants},
            {v.name: 10.0 for v in ablation.variants}, {v.name: 1000 for v in ablation.variants})
  before = _finished_files(str(tmp_path))
  other = table("devlin_table6", "tiny")
  with pytest.raises(failures.UserError, match=r"holds variants of another table \(.*mlm_nsp.*\), not"):
    ablate_main.run_and_report(other, str(tmp_path), train=False)
  assert _finished_files(str(tmp_path)) == before


def test_create_once_keeps_the_first_writer_s_file(tmp_path):
  from bert_jax import atomic_write  # pylint: disable=g-import-not-at-top
  path = str(tmp_path / "config.json")
  assert atomic_write.create_once(path, "first") and not atomic_write.create_once(path, "second")
  assert open(path).read() == "first" and os.listdir(tmp_path) == ["config.json"]


def test_size_table_plots_against_parameters_and_counts_agreeing_pairs(tmp_path):
  ablation = table("devlin_table6", "tiny")
  names = [v.name for v in ablation.variants]
  # Larger models: lower perplexity and higher accuracy, as in the paper, except the last two swapped.
  acc = {n: [0.6 + 0.02 * i, 0.61 + 0.02 * i] for i, n in enumerate(names)}
  acc[names[-1]], acc[names[-2]] = acc[names[-2]], acc[names[-1]]
  _fake_run(ablation, str(tmp_path), acc, {n: 20.0 - i for i, n in enumerate(names)},
            {n: 1000 * (i + 1) for i, n in enumerate(names)})
  text = ablate_main.run_and_report(ablation, str(tmp_path), train=False)
  assert "ordered as in the paper: 15 of 15 (ties left out); one run each: no test" in text   # perplexity
  assert "ordered as in the paper: 14 of 15 (ties left out); our difference exceeds the seed variation in " in text
  assert "Larger model better in 15 of 15 pairs of different size: monotone in size." in text   # perplexity
  assert "Larger model better in 14 of 15 pairs of different size: not monotone in size." in text   # sst2
  assert (tmp_path / "results.png").stat().st_size > 1000


# ------------------------------------------------------------------------------------------------
# A tiny ablation, killed in the middle and run again.


@pytest.fixture(scope="module")
def corpus(data_dir, tmp_path_factory):
  """test_train's prepared corpus (vocabulary 128) and an SST-2-format task written with its words."""
  rng = np.random.default_rng(0)
  task = tmp_path_factory.mktemp("ablate_sst2")
  things = "king queen knight horse castle sword".split()
  for split, n in (("train", 40), ("dev", 16)):
    rows = ["sentence\tlabel"]
    for i in range(n):
      a, b = rng.choice(things, 2)
      rows.append(f"the {'brave' if i % 2 else 'old'} {a} sees the {b} .\t{i % 2}")
    (task / f"{split}.tsv").write_text("\n".join(rows) + "\n")
  return data_dir, str(task)


# Table 5 at the tiny scale with its first two variants (the third compiles another model: time).
TWO_VARIANTS = """from configs.ablations import devlin_table5


def get_config(arg="tiny"):
  c = devlin_table5.get_config(arg)
  c.variants = c.variants[:2]
  return c
"""


def _finished_files(workdir: str) -> dict[str, float]:
  """mtime of every marker and pretraining checkpoint file under `workdir`."""
  found = {}
  for root, _, files in os.walk(workdir):
    for f in files:
      path = os.path.join(root, f)
      if f in (runner.PRETRAINED, runner.EVALUATED, runner.FINETUNED, "DONE") or f"{os.sep}checkpoints{os.sep}" in path:
        found[os.path.relpath(path, workdir)] = os.stat(path).st_mtime_ns
  return found


@pytest.mark.slow
def test_killed_ablation_resumes_without_redoing_finished_runs(corpus, tmp_path, compilation_cache):
  (tmp_path / "two_variants.py").write_text(TWO_VARIANTS)
  ablation = table("devlin_table5", "tiny")
  ablation.variants = ablation.variants[:2]
  ablation.base.data.train_files, ablation.tasks.sst2.data_dir = corpus
  uninterrupted = str(tmp_path / "uninterrupted")
  ablate_main.run_and_report(ablation, uninterrupted)

  # The command line, killed (SIGKILL: no chance to clean up) once the first variant finetunes.
  killed = str(tmp_path / "killed")
  command = [sys.executable, "-m", "bert_jax.cli", "ablate", f"--config={tmp_path / 'two_variants.py'}:tiny",
             f"--workdir={killed}", f"--config.base.data.train_files={corpus[0]}",
             f"--config.tasks.sst2.data_dir={corpus[1]}"]
  env = dict(os.environ, **compilation_cache_env(compilation_cache))
  proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  trials = os.path.join(killed, "mlm_nsp", "finetune", "sst2", "trials")
  deadline = time.time() + 300
  while time.time() < deadline and proc.poll() is None and not (os.path.isdir(trials) and os.listdir(trials)):
    time.sleep(0.01)
  proc.send_signal(signal.SIGKILL)
  out, _ = proc.communicate(timeout=60)
  assert proc.returncode == -signal.SIGKILL, out[-3000:]
  assert os.path.isfile(os.path.join(killed, "mlm_nsp", runner.EVALUATED))
  assert not os.path.isfile(os.path.join(trials, "..", runner.FINETUNED))
  before = _finished_files(killed)

  ablate_main.run_and_report(ablation, killed)
  after = _finished_files(killed)
  assert {k: after[k] for k in before} == before   # nothing finished was written again
  assert set(after) > set(before)
  for name in ("results.md", "results.csv"):
    with open(os.path.join(killed, name)) as a, open(os.path.join(uninterrupted, name)) as b:
      assert a.read() == b.read()
  with open(os.path.join(killed, "results.csv")) as f:
    rows = list(csv.DictReader(f))
  assert len(rows) == 4 and all(r["n"] == ("1" if r["measurement"] == "heldout" else "2") for r in rows)


@pytest.mark.slow
def test_sigterm_during_pretraining_stops_the_ablation_without_marking_the_variant(
    corpus, tmp_path, compilation_cache, monkeypatch):
  """train saves and returns at a SIGTERM: the variant is not pretrained until a re-run reaches the end."""
  from bert_jax import preemption  # pylint: disable=g-import-not-at-top
  ablation = table("devlin_table5", "tiny")
  ablation.variants = ablation.variants[:1]
  ablation.base.data.train_files, ablation.tasks.sst2.data_dir = corpus
  monkeypatch.setattr(preemption.Watcher, "reached", lambda self, step: step == 2)
  with pytest.raises(failures.Stopped, match="stopped at step 2 of 6"):
    runner.run(ablation, str(tmp_path))
  vdir = tmp_path / ablation.variants[0].name
  assert not (vdir / runner.PRETRAINED).exists() and not (vdir / runner.EVALUATED).exists()
  assert runner.last_checkpoint_step(str(vdir / "pretrain")) == 2
  assert failures.Stopped.exit_code == 128 + signal.SIGTERM

  monkeypatch.undo()
  ablation.tasks = {}
  runner.run(ablation, str(tmp_path))
  assert runner.read_marker(str(vdir / runner.PRETRAINED))["train_steps"] == 6
  assert runner.last_checkpoint_step(str(vdir / "pretrain")) == 6
  assert runner.read_marker(str(vdir / runner.EVALUATED))


@pytest.mark.slow
def test_variants_runs_only_the_named_ones_and_rejects_unknown_names(corpus, tmp_path, compilation_cache):
  ablation = table("devlin_table5", "tiny")
  ablation.base.data.train_files, ablation.tasks.sst2.data_dir = corpus
  ablation.tasks = {}
  first, second = (v.name for v in ablation.variants[:2])
  with pytest.raises(failures.UserError, match=f"no variant nonesuch.*{first}"):
    runner.run(ablation, str(tmp_path), only=["nonesuch", second])
  assert not os.listdir(tmp_path)   # the names are checked before anything runs

  text = ablate_main.run_and_report(ablation, str(tmp_path), only=[second])
  assert runner.read_marker(str(tmp_path / second / runner.EVALUATED))
  assert not (tmp_path / first).exists()
  assert [r["variant"] for r in runner.collect(ablation, str(tmp_path)) if r["evaluated"]] == [second]
  assert sorted(os.listdir(tmp_path)) == sorted([second, "results.csv", "results.md", "results.png"])  # no .tmp left
  rows = {line.split(" | ")[0][2:]: line for line in text.splitlines() if line.startswith("| ") and "heldout" not in line}
  labels = [v.label for v in ablation.variants[:2]]
  assert "not run" in rows[labels[0]] and "not run" not in rows[labels[1]]


def test_a_report_of_a_workdir_that_is_not_there_is_a_user_error(tmp_path):
  with pytest.raises(failures.UserError, match=r"--report_only: .*nothere does not exist"):
    ablate_main.run_and_report(table("devlin_table5", "tiny"), str(tmp_path / "nothere"), train=False)
  assert not (tmp_path / "nothere").exists()
  (tmp_path / "a_file").write_text("")
  with pytest.raises(failures.UserError, match=r"--report_only: .*a_file is a file, not a workdir"):
    ablate_main.run_and_report(table("devlin_table5", "tiny"), str(tmp_path / "a_file"), train=False)


_SIGTERM_OUTSIDE_PRETRAINING = """
import os, signal, sys, time
from absl import app
from bert_jax.ablate import main, runner
def run(*args, **kwargs):   # a SIGTERM while the ablation finetunes or evaluates
  os.kill(os.getpid(), signal.SIGTERM)
  time.sleep(60)
runner.run = run
sys.argv = ["bert-jax ablate", "--config=configs/ablations/devlin_table5.py:tiny", "--workdir=runs/a"]
app.run(main.main)
"""


def test_sigterm_outside_pretraining_stops_the_ablation_in_one_line(tmp_path):
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  os.symlink(os.path.join(repo, "configs"), tmp_path / "configs")
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=repo)
  done = subprocess.run([sys.executable, "-c", _SIGTERM_OUTSIDE_PRETRAINING], cwd=tmp_path, env=env,
                        capture_output=True, text=True, timeout=120)
  assert done.returncode == 128 + signal.SIGTERM, done.stderr[-2000:]
  assert done.stderr.strip().splitlines()[-1] == (
      "bert-jax ablate: stopped by SIGTERM; the finished pretraining, evaluations and finetuning trials are kept: "
      "the same command goes on from them")

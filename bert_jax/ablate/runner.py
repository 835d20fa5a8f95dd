"""Runs an ablation table: for each variant, pretrain, read its held-out evaluation, finetune over seeds.

Every stage goes through the library's own entry points: `train.train_and_evaluate` (what `bert-jax
pretrain` calls) and `sweep.run_sweep` (what `bert-jax sweep` calls; one configuration, several seeds).
Each finished stage leaves a JSON marker, written last and atomically (a temporary file renamed), so a
killed ablation run again redoes nothing finished and the tables are rebuilt from the markers alone:

    <workdir>/<variant>/config.json           the pretraining config (a re-run, another process's run of other
                                              variants or a report with another one is an error)
    <workdir>/<variant>/pretrain/              the pretraining run (checkpoints, metrics.jsonl, ...)
    <workdir>/<variant>/PRETRAINED             its final scalars, the steps, tokens and FLOPs it trained
    <workdir>/<variant>/EVALUATED              the held-out evaluation at the last step (metrics.jsonl)
    <workdir>/<variant>/finetune/<task>/       a sweep directory (trials/<trial>/DONE per seed)
    <workdir>/<variant>/finetune/<task>/FINETUNED   the best dev metric of every seed (config.json beside)

An unfinished pretraining resumes from its latest checkpoint (exactly, as any `bert-jax pretrain`); an
unfinished finetuning trial starts over (as in `bert-jax sweep`).
"""

import json
import os

import jax
import ml_collections

from bert_jax import checkpointing
from bert_jax import config_record
from bert_jax import failures
from bert_jax import objectives
from bert_jax import paths
from bert_jax import pretrain_data
from bert_jax import run_checks
from bert_jax import train
from bert_jax import train_setup
from bert_jax.finetune import config_checks
from bert_jax.finetune import readers
from bert_jax.finetune import sweep

PRETRAINED, EVALUATED, FINETUNED = "PRETRAINED", "EVALUATED", "FINETUNED"
CONFIG = "config.json"   # the config a stage ran with, beside its marker


# ------------------------------------------------------------------------------------------------
# Configs of the runs.


def set_field(config: ml_collections.ConfigDict, dotted: str, value) -> None:
  """`config.<dotted> = value`. A nested field must exist; a new top-level field is allowed for the
  fields an objective reads with `config.get` (ELECTRA's `generator_hidden_fraction`)."""
  *parents, name = dotted.split(".")
  node = config
  for p in parents:
    node = node[p]
  if name not in node and parents:
    raise KeyError(f"ablation override {dotted!r}: the pretraining config has no such field")
  with node.unlocked():
    node[name] = value


def variant_configs(ablation: ml_collections.ConfigDict) -> dict[str, ml_collections.ConfigDict]:
  """The pretraining config of every variant (name -> config): the base with the variant's overrides,
  then the shared budget (`budget.kind` "tokens": as the base; "flops": train steps scaled so that every
  variant spends the FLOPs of `budget.reference` in total, by bert_jax/flops.py's count; "steps": the
  reference's steps times the variant's `budget.step_ratios`, where a paper sets its budget in steps by
  its own FLOPs count)."""
  configs = {}
  for v in ablation.variants:
    c = ablation.base.copy_and_resolve_references()
    for dotted, value in v.overrides:
      set_field(c, dotted, value)
    configs[v.name] = c
  kind = ablation.budget.kind
  if kind == "flops":
    ref = configs[ablation.budget.reference]
    total = objectives.train_flops_per_step(ref) * ref.train_steps
    for c in configs.values():
      c.train_steps = max(1, round(total / objectives.train_flops_per_step(c)))
      c.optimizer.total_steps = c.train_steps
  elif kind == "steps":   # a paper's own step counts, as ratios to the reference's (`budget.step_ratios`)
    ref_steps, ratios = configs[ablation.budget.reference].train_steps, dict(ablation.budget.step_ratios)
    unknown = sorted(set(ratios) - set(configs))
    if unknown:
      raise ValueError(f"budget.step_ratios names no variant {unknown}")
    for name, c in configs.items():
      c.train_steps = max(1, round(ref_steps * ratios.get(name, 1.0)))
      c.optimizer.total_steps = c.train_steps
  elif kind == "tokens":
    tokens = {name: pretrain_tokens(c) for name, c in configs.items()}
    if len(set(tokens.values())) > 1:
      raise ValueError(f"budget 'tokens' but the variants train on different numbers of tokens: {tokens}")
  else:
    raise ValueError(f"budget.kind must be 'tokens', 'flops' or 'steps', got {kind!r}")
  return configs


def pretrain_tokens(config) -> int:
  return config.train_steps * config.global_batch_size * config.data.seq_length


def encoder_parameters(config) -> int:
  """Parameters of the encoder (`params["bert"]`, what finetuning keeps), counted from shapes only."""
  model = train_setup.build_model(config)
  batch = {k: jax.numpy.zeros(s.shape, s.dtype) for k, s in train_setup.abstract_batch(config, batch_size=1).items()}
  init = lambda rng: model.init({"params": rng, "dropout": rng}, batch, deterministic=True)["params"]
  shapes = jax.eval_shape(init, jax.random.key(0))
  encoder = shapes.get("bert", shapes)
  return int(sum(x.size for x in jax.tree.leaves(encoder)))


def task_config(ablation, task: str, checkpoint: str) -> ml_collections.ConfigDict:
  """The finetuning config of `task`: one configuration (its batch, rate and epochs), every seed."""
  c = ablation.tasks[task].copy_and_resolve_references()
  c.init_checkpoint = checkpoint
  c.sweep.grid.batch_size, c.sweep.grid.learning_rate = (c.batch_size,), (c.learning_rate,)
  c.sweep.grid.num_epochs, c.sweep.mode, c.sweep.successive_halving = (c.num_epochs,), "grid", False
  return c


# ------------------------------------------------------------------------------------------------
# Markers.


write_marker = config_record.write_marker
read_marker = config_record.read_marker
check_same_config = config_record.check_same_config


def last_checkpoint_step(pretrain_dir: str) -> int | None:
  checkpointer = checkpointing.Checkpointer(os.path.join(pretrain_dir, "checkpoints"), async_save=False)
  try:
    return checkpointer.latest_step()
  finally:
    checkpointer.close()


def final_evaluation(pretrain_dir: str, step: int) -> dict[str, float]:
  """The `eval/*` scalars logged at `step` (the last one logged there, if a resumed run logged it twice)."""
  found = {}
  with open(os.path.join(pretrain_dir, "metrics.jsonl")) as f:
    for line in f:
      record = json.loads(line) if line.strip() else {}
      if record.get("step") == step and any(k.startswith("eval/") for k in record):
        found = {k: v for k, v in record.items() if k.startswith("eval/")}
  if not found:
    raise ValueError(f"{pretrain_dir}/metrics.jsonl has no held-out evaluation at step {step}: the "
                     "ablation needs eval_steps > 0 in its pretraining config")
  return found


# ------------------------------------------------------------------------------------------------
# The stages.


def run(ablation: ml_collections.ConfigDict, workdir: str, log=print, only=()) -> None:
  """Runs every stage of every variant that has no marker yet; with `only`, of those variants alone (a table
  split between processes or hosts, each running some of its variants in the same workdir)."""
  workdir = paths.absolute(workdir)
  configs = variant_configs(ablation)
  unknown = sorted(set(only) - {v.name for v in ablation.variants})
  if unknown:
    raise failures.UserError(f"{ablation.name} has no variant {', '.join(unknown)}; its variants are "
                             f"{', '.join(v.name for v in ablation.variants)}")
  running = [v.name for v in ablation.variants if not only or v.name in only]
  check_task_data(ablation, workdir, running)
  check_task_configs(ablation, workdir, running)
  check_pretraining(configs, workdir, running)
  check_configs(ablation, workdir, configs, run=running)
  for v in ablation.variants:
    if only and v.name not in only:
      continue
    vdir = os.path.join(workdir, v.name)
    config = configs[v.name]
    if read_marker(os.path.join(vdir, PRETRAINED)) is None:
      log(f"ablate {ablation.name}/{v.name}: pretraining {config.objective} for {config.train_steps} steps")
      scalars = train.train_and_evaluate(config, os.path.join(vdir, "pretrain"))
      reached = last_checkpoint_step(os.path.join(vdir, "pretrain"))
      if reached != config.train_steps:   # SIGTERM: train saved and returned early
        raise failures.Stopped(f"{ablation.name}/{v.name}: pretraining stopped at step {reached} of "
                               f"{config.train_steps}; it is saved, and the same command resumes it")
      write_marker(os.path.join(vdir, PRETRAINED), {
          "objective": config.objective, "train_steps": config.train_steps, "tokens": pretrain_tokens(config),
          "flops": objectives.train_flops_per_step(config) * config.train_steps,
          "parameters": encoder_parameters(config),
          "final": {k: v for k, v in scalars.items() if k.startswith(("train/", "eval/"))}})
      if failures.sigterm_cut_short():   # it came while the finished pretraining wrote its report
        raise failures.Stopped(f"{ablation.name}/{v.name}: stopped by SIGTERM after its pretraining, which is "
                               "done and saved; the same command goes on from there")
    if read_marker(os.path.join(vdir, EVALUATED)) is None:
      write_marker(os.path.join(vdir, EVALUATED), final_evaluation(os.path.join(vdir, "pretrain"),
                                                                   config.train_steps))
    for task in ablation.tasks:
      fdir = os.path.join(vdir, "finetune", task)
      tc = task_config(ablation, task, os.path.join(vdir, "pretrain"))
      if read_marker(os.path.join(fdir, FINETUNED)) is None:
        log(f"ablate {ablation.name}/{v.name}: finetuning {tc.task} over seeds {list(tc.sweep.seeds)}")
        rows = sweep.run_sweep(tc, fdir, check_config=False)   # checked above, the checkpoint's path left out
        write_marker(os.path.join(fdir, FINETUNED), {
            "task": tc.task, "metric": rows[0]["metric"],
            "seeds": [r["seed"] for r in rows], "scores": [r["best"] for r in rows]})


def check_pretraining(configs: dict, workdir: str, variants) -> None:
  """The pretraining config and inputs (`run_checks`, as `bert-jax pretrain` checks them) of each of `variants` still
  to pretrain: a mistyped corpus or a field out of range stops the table before its configs are recorded, and the
  corrected command takes the workdir."""
  for name in variants:
    if read_marker(os.path.join(workdir, name, PRETRAINED)) is None:
      config = paths.absolute_config(configs[name].copy_and_resolve_references(), paths.PRETRAIN_FIELDS)
      try:
        run_checks.validate(config)
        run_checks.check_inputs(config)
        # A vocabulary larger than the model's table (an embedded corpus without data.vocab_file gets one of the
        # model's size).
        if not config.data.train_files.startswith("embedded:") or config.data.vocab_file:
          pretrain_data.load_tokenizer(config.data, config)
      except failures.UserError as e:   # its fields as this command line sets them: under `base`
        raise failures.UserError(f"variant {name}'s pretraining config (the table's base with the variant's "
                                 f"overrides; a field F is --config.base.F here): "
                                 + str(e).replace("--config.", "--config.base.")) from None


def check_task_configs(ablation: ml_collections.ConfigDict, workdir: str, variants) -> None:
  """Each task config's fields (`finetune.config_checks`) where one of `variants` has the task still to finetune:
  a field out of range stops the table before its variants pretrain and before the configs are recorded."""
  for task in ablation.tasks:
    if all(read_marker(os.path.join(workdir, v, "finetune", task, FINETUNED)) for v in variants):
      continue
    c = task_config(ablation, task, "")
    said = config_checks.problems(c) + config_checks.sweep_problems(c, grid=False)
    if said:
      raise failures.UserError(f"invalid config of task {task}:\n  "
                               + "\n  ".join(p.replace("--config.", f"--config.tasks.{task}.") for p in said))


def check_task_data(ablation: ml_collections.ConfigDict, workdir: str, variants) -> None:
  """Each task's `data_dir` (a local directory or file; TFDS names are read later) is set and there where one
  of `variants` has the task still to finetune: a missing or mistyped one stops the table before its variants
  pretrain and before the task configs are recorded, naming the field as the command line sets it."""
  for task in ablation.tasks:
    if all(read_marker(os.path.join(workdir, v, "finetune", task, FINETUNED)) for v in variants):
      continue
    data_dir, flag = ablation.tasks[task].get("data_dir", ""), f"--config.tasks.{task}.data_dir"
    if not data_dir:
      raise failures.UserError(f"tasks.{task}.data_dir is not set: set {flag} to the directory holding the "
                               "task's files (or to the file itself)")
    if not readers.is_tfds(data_dir) and not os.path.exists(paths.absolute(data_dir)):
      raise failures.UserError(f"{data_dir} does not exist: set {flag} to the directory holding the task's "
                               "files (or to the file itself)")


# The data paths a report's command may leave unset (`--report_only` reads no data); a model's (init_from, a
# teacher) stay compared.
_PRETRAIN_DATA = ("data.train_files", "data.eval_files", "data.vocab_file")
_TASK_DATA = ("data_dir", "task_opts.tfds_data_dir", "vocab_file")


def check_configs(ablation: ml_collections.ConfigDict, workdir: str, configs: dict | None = None,
                  run=(), report: bool = False) -> None:
  """Each variant's pretraining and task configs against those its directories recorded: the variants in
  `run` record theirs on their first run, the others are compared where they have one. One table is one
  experiment: processes that each run some variants (`--variants`) or a report of runs made before
  (`--report_only`) with another base, task or variant config stop, naming the fields, instead of putting
  two experiments side by side. `report`: the data paths the command leaves unset are not compared (a report
  reads no data: `--report_only` needs no `--config.base.data.train_files` or task `data_dir`)."""
  configs = variant_configs(ablation) if configs is None else configs
  names = {v.name for v in ablation.variants}
  others = sorted(d for d in (os.listdir(workdir) if os.path.isdir(workdir) else ()) if d not in names
                  and any(os.path.isfile(os.path.join(workdir, d, f)) for f in (CONFIG, PRETRAINED)))
  if others:
    raise failures.UserError(f"{workdir} holds variants of another table ({', '.join(others[:5])}), not "
                             f"{ablation.name}'s: give another --workdir")
  for v in ablation.variants:
    record = v.name in run
    vdir = os.path.join(workdir, v.name)
    if record:
      os.makedirs(vdir, exist_ok=True)
    check_same_config(os.path.join(vdir, CONFIG), configs[v.name], paths.PRETRAIN_FIELDS, record=record,
                      unset_match=_PRETRAIN_DATA if report else ())
    for task in ablation.tasks:
      fdir = os.path.join(vdir, "finetune", task)
      if record:
        os.makedirs(fdir, exist_ok=True)
      # The checkpoint's path is left out: a moved workdir holds the same experiment.
      check_same_config(os.path.join(fdir, CONFIG), task_config(ablation, task, os.path.join(vdir, "pretrain")),
                        paths.FINETUNE_FIELDS, ignore=("init_checkpoint",), record=record,
                        unset_match=_TASK_DATA if report else ())


def collect(ablation: ml_collections.ConfigDict, workdir: str) -> list[dict]:
  """What is on disk, one dict per variant (in the config's order); a stage not finished is None. The
  variants' recorded configs must be this ablation's (`check_configs`)."""
  workdir = paths.absolute(workdir)
  check_configs(ablation, workdir, report=True)
  rows = []
  for v in ablation.variants:
    vdir = os.path.join(workdir, v.name)
    finetuned = {t: read_marker(os.path.join(vdir, "finetune", t, FINETUNED)) for t in ablation.tasks}
    rows.append({"variant": v.name, "label": v.label, "heldout_metric": v.heldout_metric,
                 "pretrained": read_marker(os.path.join(vdir, PRETRAINED)),
                 "evaluated": read_marker(os.path.join(vdir, EVALUATED)), "finetuned": finetuned})
  return rows

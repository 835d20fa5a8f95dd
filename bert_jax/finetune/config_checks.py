"""A finetuning config's fields out of range, said before anything is read or compiled (as run_checks.py says
pretraining's): `bert-jax finetune`, `sweep`, `ablate` and `bert_jax.fit` stop on them in one paragraph, exit 2.

What needs the checkpoint (a sequence longer than its position table) is checked where it is loaded
(`trainer`), what needs the task's files where they are read (`readers`).
"""

import numbers

from bert_jax import failures

MIN_SEQ_LENGTH = 8   # [CLS], one or two [SEP] and a few word pieces of each text


def _number(value) -> bool:
  return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _whole(least: int):
  """A check of a whole number at least `least`."""
  return lambda v: v >= least and v == int(v)


def _above_0(v) -> bool:
  return v > 0


def problems(config) -> list[str]:
  """Each field of `config` (configs/finetune/common.py's) out of its range, in words."""
  said = []

  def need(field: str, ok, what: str) -> None:
    value = config[field]
    if not (_number(value) and ok(value)):
      said.append(f"{field} {value!r}: {what} (--config.{field})")

  need("max_seq_length", _whole(MIN_SEQ_LENGTH), f"a whole number of tokens, at least {MIN_SEQ_LENGTH}")
  need("batch_size", _whole(1), "a whole number, at least 1")
  need("eval_batch_size", _whole(0), "a whole number, 0 for batch_size's")
  need("num_epochs", _above_0, "above 0")
  need("learning_rate", _above_0, "above 0")
  need("warmup_fraction", lambda v: 0 <= v <= 1, "a fraction of the steps, 0 to 1")
  need("layerwise_lr_decay", lambda v: 0 < v <= 1, "above 0 and at most 1 (1: no decay)")
  need("log_every_steps", _whole(1), "a whole number of steps, at least 1")
  need("eval_every_steps", _whole(0), "a whole number of steps, 0 for every epoch's end")
  need("early_stopping_patience", _whole(0), "a whole number of evaluations, 0 for never")
  need("max_train_examples", _whole(0), "a whole number, 0 for all")
  need("max_eval_examples", _whole(0), "a whole number, 0 for all")
  return said


def sweep_problems(config, grid: bool = True) -> list[str]:
  """Each field of `config.sweep` out of its range, in words; `grid` False leaves out `sweep.grid` (a config whose
  grid is its own batch size, rate and epochs, which `problems` checks: an ablation's task)."""
  s, said = config.sweep, []
  ranges = {"batch_size": (_whole(1), "whole numbers, at least 1"), "learning_rate": (_above_0, "above 0"),
            "num_epochs": (_above_0, "above 0")}
  for name, (ok, what) in ranges.items() if grid else ():
    values = tuple(s.grid[name]) if isinstance(s.grid[name], (tuple, list)) else (s.grid[name],)
    if not values or not all(_number(v) and ok(v) for v in values):
      said.append(f"sweep.grid.{name} {s.grid[name]!r}: one value or more, each {what} (--config.sweep.grid.{name})")
    else:
      said += _repeated(f"sweep.grid.{name}", values)
  seeds = tuple(s.seeds) if isinstance(s.seeds, (tuple, list)) else (s.seeds,)
  if not seeds or not all(isinstance(v, int) and not isinstance(v, bool) for v in seeds):
    said.append(f"sweep.seeds {s.seeds!r}: one whole number or more (--config.sweep.seeds)")
  else:
    said += _repeated("sweep.seeds", seeds)
  for field in ("max_trials_per_group", "num_random_trials"):
    value = s[field]
    if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
      said.append(f"sweep.{field} {value!r}: a whole number, at least 1 (--config.sweep.{field})")
  return said


def _repeated(field: str, values: tuple) -> list[str]:
  """A value listed twice (as a trial's name spells it: `sweep.trial_name`, learning rates by `:g`) would train
  the same trial twice into one folder and count it as another seed."""
  spelled = [f"{v:g}" if field.endswith("learning_rate") else str(v) for v in values]
  twice = sorted({v for v in spelled if spelled.count(v) > 1})
  return [f"{field} {values!r} lists {', '.join(twice)} more than once: each trial trains once; list each value "
          f"once (--config.{field})"] if twice else []


def validate(config, sweep: bool = False) -> None:
  """Raises `failures.UserError` listing `problems(config)` (and, with `sweep`, `sweep_problems`), if any."""
  said = problems(config) + (sweep_problems(config) if sweep else [])
  if said:
    raise failures.UserError("invalid finetuning config:\n  " + "\n  ".join(said))

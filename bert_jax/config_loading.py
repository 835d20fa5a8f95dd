"""The `--config` flag of every command: its file loaded or one line and exit 2, a config of the command's kind
(pretraining, finetuning or an ablation table), and absl's flag parsing with a misspelt `--config.` field as one
line instead of tracebacks. The errors are `failures.UserError`s, ended by `failures.say_and_exit`."""

import os
import re

from bert_jax import failures


def load_config(flag, prog: str, kind: str | None = None):
  """The config of an ml_collections `--config` flag (None when not given). A file it could not load (a
  mistyped path, one on another machine, a syntax error) stands as a proxy that raises on first use: here
  that is a UserError, one line and exit 2, which a supervisor does not restart. With `kind` ("pretrain",
  "finetune" or "ablation"), a config of another kind is such an error too, naming the command it is for."""
  config = flag.value
  try:
    if config is not None:
      config.keys()
  except _CONFIG_LOAD_ERRORS as e:
    failures.say_and_exit(config_not_loaded(e), prefix=prog)
  message = _another_kind(config, kind)
  if message is not None:
    failures.say_and_exit(failures.UserError(message), prefix=prog)
  return config


def _another_kind(config, kind: str | None) -> str | None:
  """Why `config` (loaded) is not a config of `kind`; None where it is, or where either is unknown."""
  found = config_kind(config) if config is not None and kind is not None else kind
  if found == kind:
    return None
  return (f"--config is {_KINDS[found]}, not {_KINDS[kind]}: run it with {_COMMANDS[found]}" if found else
          f"--config has the fields of no pretraining, finetuning or ablation config; this command takes "
          f"{_KINDS[kind]}")


_KINDS = {"pretrain": "a pretraining config (configs/common.py's fields)",
          "finetune": "a finetuning config (configs/finetune/common.py's fields)",
          "ablation": "an ablation table's config (configs/ablations/)"}
_COMMANDS = {"pretrain": "`bert-jax pretrain` (or `aot`, `bench train`)", "finetune": "`bert-jax finetune` or `sweep`",
             "ablation": "`bert-jax ablate`"}
# The kind of --config each command takes (their `load_config(kind=...)`), for flag errors found before it runs.
_COMMAND_KINDS = {"bert-jax pretrain": "pretrain", "bert-jax aot": "pretrain", "bert-jax bench train": "pretrain",
                  "bert-jax finetune": "finetune", "bert-jax sweep": "finetune", "bert-jax ablate": "ablation"}


def config_kind(config) -> str | None:
  """"ablation", "finetune" or "pretrain" by the fields the config holds (None: none of them)."""
  if "base" in config and "variants" in config:
    return "ablation"
  if "init_checkpoint" in config and "task" in config:
    return "finetune"
  if all(k in config for k in ("model", "data", "optimizer", "train_steps")):
    return "pretrain"
  return None


_CONFIG_LOAD_ERRORS = (OSError, SyntaxError, ImportError)


def config_not_loaded(error: BaseException) -> failures.UserError:
  """The UserError of a `--config` file that could not be loaded (`error`, ml_collections' or the file's): a file
  that is not there in one line, naming the directory relative paths start from."""
  text = str(error)
  missing = re.search(r"\[Errno 2\] No such file or directory: '([^']*)'", text)
  if missing:
    return failures.UserError(f"cannot load --config: {missing.group(1)} does not exist (a relative path is taken "
                              f"from {os.getcwd()})")
  return failures.UserError(f"cannot load --config: {text}")


def _without_traceback(message: str) -> str:
  """A flag's error with a config file's traceback in it (a `get_config` that raised: a variant that is none of
  the file's) as the flag and the exception's own line, its last (its type left out)."""
  if "Traceback (most recent call last):" not in message:
    return message
  head = message.split("Traceback (most recent call last):")[0].strip().rstrip(":")
  last = [line.strip() for line in message.splitlines() if line.strip()][-1]
  return head + ": " + re.sub(r"^[A-Za-z_][\w.]*: ", "", last)


def parse_flags(argv: list[str], prog: str = "bert-jax") -> list[str]:
  """absl's flag parsing, with a misspelt `--config.` field as one line (exit 2) instead of tracebacks: every
  command's parser (cli.py)."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    message = " ".join(_without_traceback(str(e)).split())
  except _CONFIG_LOAD_ERRORS as e:   # a `--config.` override applied to a file that could not be loaded
    failures.say_and_exit(config_not_loaded(e), prefix=prog)
    return []
  except (AttributeError, KeyError) as e:   # ml_collections: an override of a field the config lacks
    while e.args and isinstance(e.args[0], BaseException):
      e = e.args[0]
    text = ". ".join(" ".join(line.split()) for line in str(e.args[0] if e.args else e).splitlines() if line.strip())
    message = (f"unknown config field {text} The fields are those the config file defines (configs/common.py's "
               "for pretraining, configs/finetune/common.py's for finetuning, the ablation's own for ablate).")
    if "has no attribute 'get_config'" in text:   # ml_collections loaded a file that defines no config
      named = next((a.split("=", 1)[1] for a in reversed(argv) if a.startswith("--config=")), "the file")
      message = (f"cannot load --config: {named} defines no get_config(): give a config file, e.g. "
                 "configs/tiny.py, configs/finetune/sst2.py or configs/ablations/devlin_table5.py:small")
  # An override of a field the config lacks, on a config of another kind (`finetune --config=configs/tiny.py
  # --config.init_checkpoint=...`): the wrong config is the mistake to name.
  given = [a.split("=", 1)[1] for a in argv if a.startswith("--config=")]
  try:   # the file alone, without the overrides that failed
    loaded = flags.FLAGS["config"].parser.parse(given[-1]) if given and "config" in flags.FLAGS else None
    wrong = _another_kind(loaded, _COMMAND_KINDS.get(prog)) if loaded is not None else None
  except Exception:  # pylint: disable=broad-exception-caught  (the file did not load: the message above stands)
    wrong = None
  failures.say_and_exit(failures.UserError(wrong or message), prefix=prog)
  return []

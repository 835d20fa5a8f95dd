"""Paths a user types, made absolute once where they enter (the CLI flags and the config).

Orbax refuses relative checkpoint paths, and a relative path read after a `chdir` (a subprocess, a
thread pool, a library) means something else. So every command makes its path flags and its config's
path fields absolute before anything else reads them. Remote paths (`gs://...`, any `scheme://`) and
the specs the data readers understand (`embedded:...`, `tfds:...`, a finetuning `data_dir` of `tfds`) pass
unchanged.
"""

import os

import ml_collections

_SPEC_PREFIXES = ("embedded:", "tfds:")
_SPECS = ("tfds",)   # a finetuning `data_dir` of "tfds": the task's own TFDS dataset

# The path fields of each kind of config (dotted names; a missing field is skipped).
PRETRAIN_FIELDS = ("init_from", "data.train_files", "data.eval_files", "data.vocab_file", "distill.teacher")
FINETUNE_FIELDS = ("init_checkpoint", "bert_config_json", "vocab_file", "data_dir", "task_opts.tfds_data_dir")


def absolute(path: str) -> str:
  """`path` made absolute against the current directory; "", remote URLs and data specs unchanged. One path,
  commas and all (a workdir `runs/t,1` is one folder; a glob is one pattern)."""
  if not path:
    return path
  if "://" in path or path.startswith(_SPEC_PREFIXES) or path in _SPECS:
    return path
  return os.path.abspath(os.path.expanduser(path))


def output_file(path: str, flag: str = "", example: str = "") -> str:
  """An output file flag's `path`, absolute, with its folder made: commands call it before their work, so
  that `--output=out/preds.jsonl` writes into a new `out/` and a folder that cannot be made stops the
  command (an OSError, which they end with exit 2) before the work rather than after it. A `path` that is
  a folder is refused the same way (IsADirectoryError), named as the user typed it: `--<flag>=<path>`
  where `flag` is given, and `example`, a file name, makes the message say what to give instead."""
  if "://" in path:
    return path
  given = f"--{flag}={path}" if flag else path
  path = os.path.abspath(os.path.expanduser(path))   # one file: no list, no data spec (`absolute`'s)
  if os.path.isdir(path):
    hint = f", e.g. {os.path.join(given.partition('=')[2] or given, example)}" if example else ""
    raise IsADirectoryError(f"{given} is a folder: give the file to write{hint}")
  if os.path.dirname(path):
    try:
      os.makedirs(os.path.dirname(path), exist_ok=True)
    except OSError as e:
      raise OSError(f"cannot write {path}: its folder cannot be made ({e.strerror}: {e.filename})") from e
  return path


def output_dir(path: str, flag: str) -> str:
  """An output folder flag's `path`, absolute (remote ones as given); a NotADirectoryError naming `--<flag>`
  where it, or a folder above it, is a file: commands call it before their work."""
  given, path = path, absolute(path)
  if "://" in path:
    return path
  for above in [path, *_parents(path)]:
    if os.path.exists(above) and not os.path.isdir(above):
      where = ("it" if above == path else above if os.path.isabs(os.path.expanduser(given))
               else os.path.relpath(above))   # as typed
      raise NotADirectoryError(f"--{flag}={given}: {where} is a file: give a folder (a new one is made)")
  return path


def _parents(path: str):
  while os.path.dirname(path) != path:
    path = os.path.dirname(path)
    yield path


def absolute_config(config: ml_collections.ConfigDict, fields) -> ml_collections.ConfigDict:
  """`config` with the dotted `fields` that exist made absolute (in place; returns it)."""
  for dotted in fields:
    *parents, name = dotted.split(".")
    node = config
    for p in parents:
      node = node.get(p) if isinstance(node, ml_collections.ConfigDict) else None
    if not isinstance(node, ml_collections.ConfigDict) or name not in node:
      continue
    value = node[name]
    if isinstance(value, str) and value != absolute(value):
      with node.unlocked():
        node[name] = absolute(value)
  return config


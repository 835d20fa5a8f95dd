"""Markers a run leaves in its directory, and the config it was started with.

A marker is a JSON file written last and atomically (a temporary file renamed): present means complete.
`check_same_config` records a run's config on its first start and stops a later start in the same
directory with another one (naming the fields that differ): resuming must not mix two experiments.
"""

import json
import os

from etils import epath
import ml_collections

from bert_jax import atomic_write
from bert_jax import failures
from bert_jax import paths


def write_marker(path: str, record: dict) -> None:
  with atomic_write.replacing(path) as tmp, open(tmp, "w") as f:
    json.dump(record, f, indent=1, sort_keys=True)


def read_marker(path: str) -> dict | None:
  if not os.path.isfile(path):
    return None
  with open(path) as f:
    return json.load(f)


# What each kind of run leaves in its workdir from its start: a workdir holding one kind's is refused by the
# others (a pretraining run's checkpoints/ beside a finetuned task.json: neither `export` nor `predict` reads it).
_RUN_KINDS = {"pretraining": ("checkpoints",), "finetuning": ("task.json", "finetune_config.json"),
              "sweep": ("sweep_config.json",)}


def check_workdir_kind(workdir: str, kind: str) -> None:
  """Stops a run of `kind` ("pretraining", "finetuning", "sweep") in a `workdir` that holds another kind of run,
  or that is (or lies under) a file."""
  try:
    paths.output_dir(workdir, "workdir")   # it, or a folder above it, a file
  except NotADirectoryError as e:
    raise failures.UserError(str(e)) from None
  for other, names in _RUN_KINDS.items():
    found = [] if other == kind else [n for n in names if (epath.Path(workdir) / n).exists()]   # gs:// too
    if found:
      raise failures.UserError(f"{workdir} holds a {other} run ({found[0]}), not a {kind} run: give another "
                               "--workdir")
  held = _checkpoint_from_elsewhere(workdir)
  if held:
    raise failures.UserError(f"{workdir} holds a checkpoint ({held}): a run writes its own files into its "
                             "workdir, over the checkpoint's (its vocabulary among them). Give another --workdir")


# What a Hugging Face directory holds beside its config.json, and a Google TF checkpoint's index.
_HF_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "flax_model.msgpack",
               "tf_model.h5")


def _checkpoint_from_elsewhere(workdir: str) -> str | None:
  """The files of a Hugging Face or Google TF checkpoint in `workdir`, as one name; None where there are none."""
  directory = epath.Path(workdir)
  if not directory.is_dir():
    return None
  if (directory / "config.json").exists():
    weights = [n for n in _HF_WEIGHTS if (directory / n).exists()]
    if weights:
      return f"config.json, {weights[0]}"
  index = sorted(p.name for p in directory.glob("*.index"))
  return index[0] if index else None


# Fields that choose how a run compiles, not what it computes: left out of every record, so a later start may
# change them (`model.scan_unroll`: the same layers, dropout keys and updates, with or without a loop).
COMPILE_ONLY = ("model.scan_unroll",)


def check_same_config(path: str, config: ml_collections.ConfigDict, fields, ignore=(), record: bool = True,
                      unset_match=()) -> None:
  """Records `config` (its path `fields` absolute, `ignore`'s and COMPILE_ONLY's fields left out, dotted names
  for nested ones) in `path` on the first run of a stage; a later run of the stage with a different config is
  an error naming the fields, not a silent mix of two experiments. `record` False: only compares, where a
  record exists. `unset_match`: fields (dotted) that, left empty in `config`, match any recorded value (a report
  of finished runs reads no data, so its command need not name the data again)."""
  ours = json.loads(paths.absolute_config(config.copy_and_resolve_references(), fields).to_json())
  unset = tuple(f for f in unset_match if not _flat(ours).get(f))
  ignore = (*ignore, *COMPILE_ONLY, *unset)
  if record and atomic_write.create_once(path, json.dumps(_without(ours, ignore), indent=1, sort_keys=True)):
    return   # the first run (of two processes starting at once, one records and the other compares)
  theirs = read_marker(path)
  if theirs is None:
    return
  ours, theirs = _flat(_without(ours, ignore)), _flat(_without(theirs, ignore))
  differ = sorted(k for k in set(ours) | set(theirs) if not _same(k, ours, theirs))
  if differ:
    more = f" and {len(differ) - 5} more" if len(differ) > 5 else ""
    raise failures.UserError(f"{os.path.dirname(path)} holds a run of another config ({', '.join(differ[:5])}{more} "
                             "differ): give another --workdir, or remove that directory to run it again")


# Fields whose default became None (follow the checkpoint) from the value here: a run recorded with that value
# resumes, or prints its results, under the new default (finetuning's `do_lower_case`, True before it followed
# the checkpoint's tokenizer_config.json; for an uncased checkpoint the two are one).
_DEFAULT_WAS = {"do_lower_case": True}


def _same(key: str, ours: dict, theirs: dict) -> bool:
  """Whether both records hold the same value at `key`. A field only one of them has (a field a later version
  added, recorded by an earlier one) is the same while it is at an empty value ("", 0, False, None), as new
  fields are: a run started before it was added resumes. So is a field of `_DEFAULT_WAS` left at None
  against its old default."""
  if key in ours and key in theirs:
    if key in _DEFAULT_WAS and ours[key] is None and theirs[key] == _DEFAULT_WAS[key]:
      return True
    return ours[key] == theirs[key]
  return not ours.get(key, theirs.get(key))   # JSON's empty values are its falsy ones


def _without(d: dict, names) -> dict:
  """`d` without the (dotted) `names`."""
  d = json.loads(json.dumps(d))
  for name in names:
    *parents, last = name.split(".")
    node = d
    for p in parents:
      node = node.get(p, {}) if isinstance(node, dict) else {}
    if isinstance(node, dict):
      node.pop(last, None)
  return d


def _flat(d: dict, prefix: str = "") -> dict:
  out = {}
  for k, v in d.items():
    out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
  return out

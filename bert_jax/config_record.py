"""Markers a run leaves in its directory, and the config it was started with.

A marker is a JSON file written last and atomically (a temporary file renamed): present means complete.
`check_same_config` records a run's config on its first start and stops a later start in the same
directory with another one (naming the fields that differ): resuming must not mix two experiments.
"""

import json
import os

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


def check_same_config(path: str, config: ml_collections.ConfigDict, fields, ignore=()) -> None:
  """Records `config` (its path `fields` absolute, `ignore` left out) in `path` on the first run of a stage;
  a later run of the stage with a different config is an error naming the fields, not a silent mix of two
  experiments."""
  ours = json.loads(paths.absolute_config(config.copy_and_resolve_references(), fields).to_json())
  for name in ignore:
    ours.pop(name, None)
  theirs = read_marker(path)
  if theirs is None:
    write_marker(path, ours)
    return
  differ = sorted(k for k in set(_flat(ours)) | set(_flat(theirs)) if _flat(ours).get(k) != _flat(theirs).get(k))
  if differ:
    raise failures.UserError(f"{os.path.dirname(path)} holds a run of another config ({', '.join(differ[:5])} "
                             "differ): give another --workdir, or remove that directory to run it again")


def _flat(d: dict, prefix: str = "") -> dict:
  out = {}
  for k, v in d.items():
    out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
  return out

"""Google's original TF BERT checkpoints (google-research/bert) <-> bert_jax params.

Variables are named like `bert/encoder/layer_0/attention/self/query/kernel` ([in, out]),
`bert/embeddings/LayerNorm/gamma`, `cls/predictions/output_bias`, `cls/seq_relationship/output_weights`
([2, hidden], i.e. [out, in]). Names are translated to Hugging Face names and converted by
`checkpoints_hf.from_state_dict`, so both routes share one tensor table and its checks.
"""

import json
import pathlib
import re

import numpy as np

from bert_jax.interop import checkpoints_hf
from bert_jax import host_env
from bert_jax.models import encoder as model

# Optimizer slots and counters saved beside the weights by the original pretraining script.
_SKIPPED = re.compile(r"(.*/adam_[mv]|global_step|.*/(Adam|Momentum|LAMB)(_\d+)?)$")
# Names whose HF counterpart is not found by the generic rules below.
_SPECIAL = {"cls/predictions/output_bias": "cls.predictions.bias",
            "cls/seq_relationship/output_weights": "cls.seq_relationship.weight",
            "cls/seq_relationship/output_bias": "cls.seq_relationship.bias"}
_TABLES = ("word_embeddings", "position_embeddings", "token_type_embeddings")
_LEAF_TO_HF = {"kernel": "weight", "gamma": "weight", "beta": "bias", "bias": "bias"}


def tf_to_hf_name(name: str) -> tuple:
  """TF variable name -> (HF tensor name, whether the array must be transposed)."""
  if name in _SPECIAL:
    return _SPECIAL[name], False
  parts = name.split("/")
  if parts[0] == "bert":
    parts = parts[1:]
  parts = [re.sub(r"^layer_(\d+)$", r"layer.\1", p) for p in parts]
  if parts[-1] in _TABLES:
    return ".".join(parts + ["weight"]), False
  if parts[-1] in _LEAF_TO_HF:
    return ".".join(parts[:-1] + [_LEAF_TO_HF[parts[-1]]]), parts[-1] == "kernel"
  return name, False  # left as is: reported as unexpected


def hf_to_tf_name(name: str) -> tuple:
  """HF tensor name (without `bert.` prefix) -> (TF variable name, whether to transpose)."""
  special = {v: k for k, v in _SPECIAL.items()}
  if name in special:
    return special[name], False
  parts = name.split(".")
  parts = ["bert"] + parts if parts[0] != "cls" else parts
  stem = "/".join(parts[:-1])
  stem = re.sub(r"layer/(\d+)", r"layer_\1", stem)
  if parts[-2] in _TABLES:
    return stem, False
  if parts[-2] == "LayerNorm":
    return f"{stem}/{'gamma' if parts[-1] == 'weight' else 'beta'}", False
  return f"{stem}/{'kernel' if parts[-1] == 'weight' else 'bias'}", parts[-1] == "weight"


def _checkpoint_prefix(ckpt_path) -> str:
  """A checkpoint prefix, or a directory: its `checkpoint` state file, else its only `*.index`."""
  tf = host_env.import_tensorflow()
  path = pathlib.Path(ckpt_path)
  if not path.is_dir():
    return str(path)
  latest = tf.train.latest_checkpoint(str(path))
  if latest is not None:
    return latest
  indexes = sorted(path.glob("*.index"))
  if len(indexes) != 1:
    raise FileNotFoundError(f"{path}: expected one TF checkpoint (*.index), found {[p.name for p in indexes]}")
  return str(indexes[0].with_suffix(""))


def config_dict(config_path) -> dict:
  """A TF checkpoint's bert_config.json as the model's config dict: the GELU `save_tf` records for ours."""
  d = json.loads(pathlib.Path(config_path).read_text())
  if _OURS in d:   # written by `save_tf`
    d["hidden_act"] = d.pop(_OURS)
  return d


def load_tf(ckpt_path, bert_config_json=None, scan_layers: bool = False, **config_overrides) -> tuple:
  """A Google TF checkpoint -> (BertConfig, {"bert", "mlm"/"nsp" if present} as numpy arrays).

  Args:
    ckpt_path: checkpoint prefix (`.../bert_model.ckpt`) or the directory holding it.
    bert_config_json: defaults to `bert_config.json` beside the checkpoint.
    scan_layers: return the scanned layout.
  """
  tf = host_env.import_tensorflow()
  prefix = _checkpoint_prefix(ckpt_path)
  config_path = pathlib.Path(bert_config_json or pathlib.Path(prefix).parent / "bert_config.json")
  cfg = model.BertConfig.from_hf_dict(config_dict(config_path), scan_layers=scan_layers, **config_overrides)
  reader = tf.train.load_checkpoint(prefix)
  state, tf_names = {}, {}
  for name in reader.get_variable_to_shape_map():
    if _SKIPPED.fullmatch(name):
      continue
    hf_name, transpose = tf_to_hf_name(name)
    value = np.asarray(reader.get_tensor(name))
    state[hf_name], tf_names[hf_name] = (value.T if transpose else value), name
  # Errors name the variables as they are (or would be) in the TF checkpoint.
  file_name = lambda n: tf_names.get(n) or hf_to_tf_name(n)[0]
  return cfg, checkpoints_hf.from_state_dict(cfg, state, scan_layers=scan_layers, file_name=file_name)


def save_tf(ckpt_prefix, cfg: model.BertConfig, params: dict) -> None:
  """Writes a TF checkpoint with Google's variable names, plus `bert_config.json` beside it."""
  tf = host_env.import_tensorflow()
  names, tensors = [], []
  for hf_name, value in checkpoints_hf.to_state_dict(cfg, params).items():
    tf_name, transpose = hf_to_tf_name(hf_name.removeprefix("bert."))
    names.append(tf_name)
    tensors.append(tf.constant(np.ascontiguousarray(value.T if transpose else value)))
  prefix = pathlib.Path(ckpt_prefix)
  prefix.parent.mkdir(parents=True, exist_ok=True)
  tf.raw_ops.SaveV2(prefix=str(prefix), tensor_names=names, shape_and_slices=[""] * len(names), tensors=tensors)
  (prefix.parent / "bert_config.json").write_text(json.dumps(_google_config(cfg), indent=2) + "\n")


# google-research/bert's `get_activation` knows "gelu" (its tanh approximation), "relu", "tanh" and "linear".
# A config written for it names either GELU "gelu" and keeps ours beside it, under a key its BertConfig
# ignores, for `load_tf` to read back; a checkpoint of Google's own "gelu" loads as the exact form, as
# Hugging Face's port runs those checkpoints.
_OURS = "bert_jax_hidden_act"


def _google_config(cfg: model.BertConfig) -> dict:
  d = cfg.to_hf_dict()
  if d.get("hidden_act", "").startswith("gelu"):
    d[_OURS], d["hidden_act"] = d["hidden_act"], "gelu"
  return d

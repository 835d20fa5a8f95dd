"""Hugging Face ModernBERT tensors (`ModernBertModel`, `ModernBertForMaskedLM`) <-> bert_jax params.

ModernBERT's names: `embeddings.tok_embeddings`, `embeddings.norm`, `layers.{i}.attn_norm` (none in layer 0),
`layers.{i}.attn.Wqkv` (query, key and value in one [3 * H, H] linear), `layers.{i}.attn.Wo`,
`layers.{i}.mlp_norm`, `layers.{i}.mlp.Wi` ([2 * I, H]: the GeGLU input half, then the gate),
`layers.{i}.mlp.Wo`, `final_norm`, under `model.` when saved with the MLM head `head.dense`, `head.norm` and
`decoder` (its weight tied to the token embeddings, its bias our MLM bias). Biases appear where the config
has them (`norm_bias`, `dense_bias`). ModernBERT has no pooler: `checkpoints_hf` adds a fresh one on import,
and none is written.
"""

import jax
import numpy as np

PREFIX = "model."
HEAD = ("head.dense", "head.norm", "decoder.bias")   # our mlm transform, layer_norm, output_bias
DECODER = "decoder.weight"                             # tied to the token embeddings: checked, never written
_QKV = ("query", "key", "value")


def _linear(cfg, hf: str, path: tuple) -> list:
  bias = [(f"{hf}.bias", path + ("bias",), "plain")] if cfg.dense_bias else []
  return [(f"{hf}.weight", path + ("kernel",), "linear")] + bias


def _norm(cfg, hf: str, path: tuple) -> list:
  bias = [(f"{hf}.bias", path + ("bias",), "plain")] if cfg.norm_bias else []
  return [(f"{hf}.weight", path + ("scale",), "plain")] + bias


def tensor_table(cfg, mlm: bool) -> list:
  """[(hf_name, param path, kind)], encoder names without `model.`; `kind` "qkv" names the fused Wqkv."""
  emb = ("bert", "embeddings")
  table = [("embeddings.tok_embeddings.weight", emb + ("word_embeddings", "embedding"), "plain")]
  table += _norm(cfg, "embeddings.norm", emb + ("layer_norm",))
  for i in range(cfg.num_layers):
    hf, ours = f"layers.{i}.", ("bert", "encoder", f"layer_{i}")
    if i:
      table += _norm(cfg, f"{hf}attn_norm", ours + ("attention_layer_norm",))
    table += [(f"{hf}attn.Wqkv.weight", ours + ("attention",), "qkv")]
    if cfg.dense_bias:
      table += [(f"{hf}attn.Wqkv.bias", ours + ("attention",), "qkv_bias")]
    table += [(f"{hf}attn.Wo.weight", ours + ("attention", "out", "kernel"), "out_kernel")]
    if cfg.dense_bias:
      table += [(f"{hf}attn.Wo.bias", ours + ("attention", "out", "bias"), "plain")]
    table += _norm(cfg, f"{hf}mlp_norm", ours + ("output_layer_norm",))
    table += _linear(cfg, f"{hf}mlp.Wi", ours + ("intermediate",))
    table += _linear(cfg, f"{hf}mlp.Wo", ours + ("output",))
  table += _norm(cfg, "final_norm", ("bert", "final_layer_norm"))
  if mlm:
    table += _linear(cfg, HEAD[0], ("mlm", "transform")) + _norm(cfg, HEAD[1], ("mlm", "layer_norm"))
    table += [(HEAD[2], ("mlm", "output_bias"), "plain")]
  return table


def _to_jax(cfg, kind: str, w: np.ndarray):
  """One HF tensor as our param; "qkv" kinds give {"query": {...}, "key": ..., "value": ...} pieces."""
  h, n, k = cfg.hidden_size, cfg.num_heads, cfg.head_dim
  if kind == "linear":
    return w.T
  if kind == "out_kernel":
    return w.T.reshape(n, k, h)
  if kind == "qkv":     # rows: the query's, the key's, the value's (ModernBertAttention's view(.., 3, n, k))
    return {name: {"kernel": part.T.reshape(h, n, k)} for name, part in zip(_QKV, np.split(w, 3))}
  if kind == "qkv_bias":
    return {name: {"bias": part.reshape(n, k)} for name, part in zip(_QKV, np.split(w, 3))}
  return w


def _to_hf(cfg, kind: str, value) -> np.ndarray:
  h = cfg.hidden_size
  if kind == "linear":
    return value.T
  if kind == "out_kernel":
    return value.reshape(h, h).T
  if kind == "qkv":
    return np.concatenate([value[name]["kernel"].reshape(h, h).T for name in _QKV])
  if kind == "qkv_bias":
    return np.concatenate([value[name]["bias"].reshape(h) for name in _QKV])
  return value


def _merge(tree: dict, path: tuple, value) -> None:
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  if isinstance(value, dict):
    for key, sub in value.items():
      _merge(tree.setdefault(path[-1], {}), (key,), sub)
  else:
    tree[path[-1]] = value


def _expected(path: tuple, shapes: dict) -> dict:
  """{param path: shape} of `shapes` under `path`."""
  return {p: s for p, s in shapes.items() if p[:len(path)] == path}


def _fits(cfg, kind: str, w: np.ndarray, path: tuple, shapes: dict):
  """`_to_jax` of `w` when every piece has its expected shape, else None."""
  try:
    value = _to_jax(cfg, kind, w)
  except ValueError:   # a reshape that cannot be
    return None
  pieces = {}
  _merge(pieces, path, value)
  flat = jax.tree_util.tree_flatten_with_path(pieces)[0]
  fits = all(tuple(x.shape) == shapes.get(tuple(k.key for k in p)) for p, x in flat)
  return value if fits else None


def from_state_dict(cfg, state: dict, shapes: dict) -> dict:
  """HF tensors -> {"bert": ..., "mlm" when saved}, unscanned, no pooler; raises ValueError naming every
  missing, unexpected, misshapen or untied tensor. `shapes`: {param path: shape} (`expected_shapes`)."""
  state = {name.removeprefix(PREFIX): np.asarray(value) for name, value in state.items()}
  mlm = any(name.startswith(("head.", "decoder.")) for name in state)
  params, problems, used = {}, [], set()
  for name, path, kind in tensor_table(cfg, mlm):
    if name not in state:
      problems.append(f"missing tensor {name} (for {'/'.join(path)})")
      continue
    used.add(name)
    value = _fits(cfg, kind, state[name].astype(np.float32), path, shapes)
    if value is None:
      problems.append(f"misshapen tensor {name}: {state[name].shape} does not give {'/'.join(path)} "
                      f"{_expected(path, shapes)}")
      continue
    _merge(params, path, value)
  if DECODER in state:
    used.add(DECODER)
    if not np.array_equal(state[DECODER], state.get("embeddings.tok_embeddings.weight")):
      problems.append(f"tensor {DECODER} is not tied to model.embeddings.tok_embeddings.weight: untied "
                      "decoders are not supported")
  problems += [f"unexpected tensor {n} {state[n].shape}" for n in sorted(set(state) - used)]
  if problems:
    raise ValueError("checkpoint does not match the modernbert config:\n  " + "\n  ".join(problems))
  return params


def to_state_dict(cfg, params: dict) -> dict:
  """Unscanned params -> HF tensors (`model.` prefixed with an "mlm" head; any pooler left out)."""
  mlm = "mlm" in params
  state = {}
  for name, path, kind in tensor_table(cfg, mlm):
    value = params
    for key in path:
      value = value[key]
    full = name if (not mlm or name.startswith(("head.", "decoder."))) else PREFIX + name
    state[full] = np.ascontiguousarray(_to_hf(cfg, kind, value), dtype=np.float32)
  return state

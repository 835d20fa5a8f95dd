"""Hugging Face checkpoints of the BERT family (BERT, ALBERT, RoBERTa, ELECTRA, DistilBERT, ModernBERT) <->
bert_jax params.

A Hugging Face directory holds `config.json` (its `model_type` names the family), `model.safetensors` and
usually tokenizer files. Tensor names are those of `transformers` (`BertModel`: `embeddings.word_embeddings.weight`,
...), with the family's prefix (`bert.`, `albert.`, `roberta.`) when saved from a model with heads: the
pretraining heads (`BertForPreTraining`: `cls.predictions.*`, `cls.seq_relationship.*`; `AlbertForPreTraining`:
`predictions.*`, `sop_classifier.*`; `RobertaForMaskedLM`: `lm_head.*`) are our "mlm" and "nsp"; the
finetuning heads `classifier.*` (sequence or token classification) and `qa_outputs.*` are ours under the
same names. `hf_families.FAMILIES` says how each family (ELECTRA, DistilBERT, ModernBERT ...) names what.

The conversion is by explicit name table (`tensor_table`), so a missing, unexpected or misshapen tensor is
an error naming it. The only tensors skipped are documented buffers and tied copies (`hf_families.IGNORED`,
the family's tied decoder). A checkpoint with a head but no pooler (a MaskedLM, token classification or QA
class) gets a newly initialised pooler, as transformers does.
"""

import dataclasses
import json
import pathlib
import shutil

from absl import logging
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

from bert_jax.interop import hf_families
from bert_jax.interop import modernbert_hf
from bert_jax.models import heads
from bert_jax.models import encoder as model


def electra_config(d: dict, **overrides) -> model.BertConfig:
  """BertConfig of an ElectraConfig dict (`BertConfig.from_hf_dict` reads them; kept for its callers)."""
  return model.BertConfig.from_hf_dict({**d, "model_type": "electra"}, **overrides)


def electra_hf_dict(cfg: model.BertConfig) -> dict:
  """An ElectraConfig dict of `cfg` (BERT's keys, with `embedding_size`)."""
  if cfg.share_layers or cfg.position_pad_id is not None:
    raise ValueError("transformers' ELECTRA shares no layers and has BERT's position ids")
  if cfg.embedding_size == cfg.hidden_size:
    # Ours projects the embeddings even at E == H; transformers' ElectraModel then has no projection and
    # would drop ours, whose output the residual stream carries: it cannot be folded away.
    raise ValueError(f"an ELECTRA with embedding_size {cfg.embedding_size} == hidden_size has an embedding "
                     "projection transformers' ElectraModel leaves out at that size; train with "
                     "model.embedding_size unset (no projection) to export it")
  d = dataclasses.replace(cfg, embedding_size=None).to_hf_dict()
  d.update(model_type="electra", architectures=["ElectraForPreTraining"], embedding_size=cfg.embedding_dim)
  return d


# safetensors dtype names (its format spec). safetensors.numpy has no bfloat16, a common storage type.
_SAFETENSORS_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
                       "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
                       "BOOL": np.bool_}


def _transforms(cfg: model.BertConfig):
  """kind -> (to_jax, to_hf). HF Linear weights are [out, in]; our kernels [in, out] with heads split."""
  # The head count is read off each tensor: a layer with `pruned_heads` has fewer.
  h, k = cfg.hidden_size, cfg.head_dim
  return {
      "plain": (lambda w: w, lambda w: w),
      "linear": (lambda w: w.T, lambda w: w.T),
      "qkv_kernel": (lambda w: w.T.reshape(h, w.shape[0] // k, k), lambda w: w.reshape(h, w.shape[1] * k).T),
      "qkv_bias": (lambda w: w.reshape(w.shape[0] // k, k), lambda w: w.reshape(-1)),
      "out_kernel": (lambda w: w.T.reshape(w.shape[1] // k, k, h), lambda w: w.reshape(w.shape[0] * k, h).T),
  }


def _dense(hf: str, path: tuple):
  return [(f"{hf}.weight", path + ("kernel",), "linear"), (f"{hf}.bias", path + ("bias",), "plain")]


def _layer_norm(hf: str, path: tuple):
  return [(f"{hf}.weight", path + ("scale",), "plain"), (f"{hf}.bias", path + ("bias",), "plain")]


def tensor_table(cfg: model.BertConfig, mlm: bool = False, nsp: bool = False, head: str | None = None,
                 pooler: bool = True, discriminator: bool = False, model_type: str | None = None):
  """[(hf_name, param path, kind)] for the unscanned layout; encoder names are without the family's prefix.

  `head`: one of hf_families.HEADS (a finetuning head); `pooler` False for the classes that save none;
  `discriminator`: ELECTRA's replaced-token head.
  """
  if cfg.shared_sublayer:
    raise ValueError(f"shared_sublayer {cfg.shared_sublayer!r}: no Hugging Face family shares one sublayer "
                     "across layers (ALBERT shares all of them or none)")
  fam = hf_families.family(cfg, model_type)
  emb = ("bert", "embeddings")
  tables = ("word_embeddings", "position_embeddings") + (("token_type_embeddings",) if cfg.type_vocab_size else ())
  table = [(f"embeddings.{t}.weight", emb + (t, "embedding"), "plain") for t in tables]
  table += _layer_norm("embeddings.LayerNorm", emb + ("layer_norm",))
  if cfg.embedding_size is not None:
    table += _dense(fam.projection, emb + ("projection",))
  layers = [("shared_layer", 0)] if cfg.share_layers else [(f"layer_{i}", i) for i in range(cfg.num_layers)]
  for name, i in layers:
    hf, ours, names = fam.layer.format(i=i), ("bert", "encoder", name), fam.layer_names
    for qkv in ("query", "key", "value"):
      table += [(f"{hf}{names[qkv]}.weight", ours + ("attention", qkv, "kernel"), "qkv_kernel"),
                (f"{hf}{names[qkv]}.bias", ours + ("attention", qkv, "bias"), "qkv_bias")]
    table += [(f"{hf}{names['out']}.weight", ours + ("attention", "out", "kernel"), "out_kernel"),
              (f"{hf}{names['out']}.bias", ours + ("attention", "out", "bias"), "plain")]
    table += _layer_norm(f"{hf}{names['attention_layer_norm']}", ours + ("attention_layer_norm",))
    table += _dense(f"{hf}{names['intermediate']}", ours + ("intermediate",))
    table += _dense(f"{hf}{names['output']}", ours + ("output",))
    table += _layer_norm(f"{hf}{names['output_layer_norm']}", ours + ("output_layer_norm",))
  if pooler and fam.pooler is not None:
    table += _dense(fam.pooler, ("bert", "pooler"))
  if head is not None:
    table += _dense(head, (head,))
  if mlm:
    transform, norm, bias = fam.mlm
    table += _dense(transform, ("mlm", "transform"))
    table += _layer_norm(norm, ("mlm", "layer_norm"))
    table += [(bias, ("mlm", "output_bias"), "plain")]
  if nsp:
    if fam.nsp is None:
      raise ValueError(f"{fam.classes} has no sentence-pair head: params with 'nsp' cannot be written as it")
    table += _dense(fam.nsp, ("nsp",))
  if discriminator:
    table += _dense(f"{fam.discriminator}.dense", ("discriminator", "dense"))
    table += _dense(f"{fam.discriminator}.dense_prediction", ("discriminator", "prediction"))
  return table


def expected_shapes(cfg: model.BertConfig, mlm: bool, nsp: bool) -> dict:
  """{param path: shape} of the unscanned params, from jax.eval_shape (nothing is allocated). The attention
  kernel shapes no parameter: XLA's takes the two-token input that the Pallas kernels' blocks refuse."""
  cfg = dataclasses.replace(cfg, scan_layers=False, attention_kernel="xla")
  ids = jnp.zeros((1, 2), jnp.int32)
  batch = {"input_ids": ids, "input_mask": ids, "segment_ids": ids, "masked_lm_positions": ids}
  if mlm:
    init = lambda: heads.BertForPreTraining(cfg, use_nsp=nsp).init(jax.random.key(0), batch)
  else:
    init = lambda: {"params": {"bert": model.BertEncoder(cfg).init(jax.random.key(0), ids)["params"]}}
  shapes = nn.unbox(jax.eval_shape(init)["params"])
  if nsp and not mlm:
    shapes["nsp"] = {"kernel": jax.ShapeDtypeStruct((cfg.hidden_size, 2), jnp.float32),
                     "bias": jax.ShapeDtypeStruct((2,), jnp.float32)}
  h = cfg.hidden_size  # ELECTRA's discriminator head: H -> H -> one logit
  shapes["discriminator"] = {"dense": {"kernel": jax.ShapeDtypeStruct((h, h), jnp.float32),
                                       "bias": jax.ShapeDtypeStruct((h,), jnp.float32)},
                             "prediction": {"kernel": jax.ShapeDtypeStruct((h, 1), jnp.float32),
                                            "bias": jax.ShapeDtypeStruct((1,), jnp.float32)}}
  flat = jax.tree_util.tree_flatten_with_path(shapes)[0]
  return {tuple(k.key for k in path): tuple(leaf.shape) for path, leaf in flat}


def _canonical_names(state: dict, fam: hf_families.Family) -> dict:
  """Strips the family's prefix, renames old-style LayerNorm gamma/beta and a RoBERTa sequence classifier's
  head (`hf_families.ROBERTA_SEQUENCE_HEAD`)."""
  out = {}
  sequence_head = fam.classes == "Roberta" and any(n.startswith("classifier.out_proj.") for n in state)
  for name, value in state.items():
    name = name.removeprefix(fam.prefix)
    if sequence_head:
      name = hf_families.sequence_head_from_hf(name)
    name = name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
    out[name] = np.asarray(value)
  return out


def _set(tree: dict, path: tuple, value):
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def from_state_dict(cfg: model.BertConfig, state: dict, scan_layers: bool = False,
                    file_name=lambda name: name, model_type: str | None = None) -> dict:
  """HF tensors -> {"bert": ..., "mlm"/"nsp"/"discriminator" when present}; raises ValueError naming every
  bad tensor.

  `file_name` maps an HF tensor name to the name to report (the TF importer reports TF names).
  """
  fam = hf_families.family(cfg, model_type)
  if fam.classes == "ModernBert":
    params = modernbert_hf.from_state_dict(cfg, state, expected_shapes(cfg, mlm=True, nsp=False))
    params["bert"]["pooler"] = _initial_pooler(cfg)
    return model.scan_params(params) if scan_layers else params
  state = _canonical_names(state, fam)
  mlm = any(n.startswith(hf_families.mlm_names(fam)) for n in state)
  nsp = fam.nsp is not None and any(n.startswith(f"{fam.nsp}.") for n in state)
  disc = fam.discriminator is not None and any(n.startswith(f"{fam.discriminator}.") for n in state)
  head = next((h for h in hf_families.HEADS if f"{h}.weight" in state and f"{h}.bias" in state), None)
  # No pooler saved (a BertModel(add_pooling_layer=False), a token or QA model, our export of one): a fresh
  # one, as transformers makes; a pooler saved in part is a missing tensor.
  fresh_pooler = fam.pooler is None or not any(n.startswith("pooler.") for n in state)
  pooler = _initial_pooler(cfg) if fresh_pooler else None
  transforms, shapes = _transforms(cfg), expected_shapes(cfg, mlm, nsp)
  if head is not None:  # as many outputs as the checkpoint's head has (labels; 2 for start/end)
    outputs = state[f"{head}.weight"].shape[0]
    shapes.update({(head, "kernel"): (cfg.hidden_size, outputs), (head, "bias"): (outputs,)})
  params, problems, used = {}, [], set(hf_families.IGNORED)
  for name, path, kind in tensor_table(cfg, mlm, nsp, head, pooler=not fresh_pooler, discriminator=disc,
                                      model_type=model_type):
    if name not in state:
      problems.append(f"missing tensor {file_name(name)} (for {'/'.join(path)})")
      continue
    used.add(name)
    value = _converted(state[name], transforms[kind][0], shapes[path])
    if value is None:
      problems.append(f"misshapen tensor {file_name(name)}: {state[name].shape}, expected {shapes[path]} "
                      f"as {'/'.join(path)}")
      continue
    _set(params, path, value)
  problems += _untied(hf_families.tied(fam), state, used, file_name)
  problems += [f"unexpected tensor {file_name(n)} {state[n].shape}" for n in sorted(set(state) - used)]
  if problems:
    raise ValueError(f"checkpoint does not match the {model_type or cfg.model_type} config:\n  "
                     + "\n  ".join(problems))
  if pooler is not None:
    params["bert"]["pooler"] = pooler
  return model.scan_params(params) if scan_layers else params


def _converted(value, transform, shape):
  """`transform(value)` in float32, or None where it is not of `shape` (or the transform cannot reshape it)."""
  try:
    value = transform(value)
  except ValueError:
    return None
  if tuple(value.shape) != shape:
    return None
  return value.astype(np.float32) if value.dtype != np.float32 else value


def _untied(tied: dict, state: dict, used: set, file_name) -> list[str]:
  """A problem for each tied tensor (name: the one it is tied to) that differs from its target; each one
  present is added to `used`."""
  problems = []
  for name, target in tied.items():
    if name in state:
      used.add(name)
      if target in state and not np.array_equal(state[name], state[target]):
        problems.append(f"tensor {file_name(name)} is not tied to {file_name(target)}: untied decoders are "
                        "not supported")
  return problems


def _initial_pooler(cfg: model.BertConfig) -> dict:
  """A fresh pooler {"kernel", "bias"} for a checkpoint that saves none (`add_pooling_layer=False`: the
  MaskedLM, token classification and question answering classes, e.g. RobertaForMaskedLM,
  BertForTokenClassification; every ELECTRA class).

  Initialised as transformers does when it loads one into a model with a pooler (normal, stddev
  initializer_range; zero bias), from a fixed seed. Masked tokens, tags and spans do not use it.
  """
  logging.warning("checkpoint has no pooler (a MaskedLM, token classification, QA or ELECTRA class): the "
                  "pooler is newly initialised")
  weight = np.random.default_rng(0).normal(0.0, cfg.initializer_range, (cfg.hidden_size, cfg.hidden_size))
  # transformers' [out, in] draw, as our [in, out] kernel.
  return {"kernel": weight.astype(np.float32).T, "bias": np.zeros(cfg.hidden_size, np.float32)}


def to_state_dict(cfg: model.BertConfig, params: dict, pooler: bool = True, model_type: str | None = None) -> dict:
  """Params (either layout) -> HF tensors; the family's prefix is used when heads are present.

  `pooler` False leaves the pooler out (the HF MaskedLM, token classification and QA classes have none);
  so do params without one (an encoder built with `pool=False`).
  """
  params = jax.tree.map(np.asarray, model.unscan_params(nn.unbox(params)))
  if hf_families.family(cfg, model_type).classes == "ModernBert":
    return modernbert_hf.to_state_dict(cfg, params)
  pooler = pooler and "pooler" in params["bert"]
  mlm, nsp, disc = "mlm" in params, "nsp" in params, "discriminator" in params
  head = next((h for h in hf_families.HEADS if h in params), None)
  fam = hf_families.family(cfg, model_type)
  prefix, top_level = (fam.prefix if (mlm or nsp or head or disc) else ""), hf_families.top_level(fam)
  transforms, state = _transforms(cfg), {}
  for name, path, kind in tensor_table(cfg, mlm, nsp, head, pooler, disc, model_type):
    value = params
    for key in path:
      value = value[key]
    full = name if name.startswith(top_level) else prefix + name
    state[full] = np.ascontiguousarray(transforms[kind][1](value), dtype=np.float32)
  if fam.classes == "Roberta" and head == "classifier" and pooler:   # RobertaForSequenceClassification's names
    state = {hf_families.sequence_head_to_hf(name, prefix): value for name, value in state.items()}
  return state


def load_hf(path, scan_layers: bool = False, **config_overrides) -> tuple:
  """A Hugging Face BERT, ALBERT, RoBERTa, ELECTRA, DistilBERT or ModernBERT directory -> (BertConfig, params
  as numpy arrays).

  Args:
    path: directory with config.json and model.safetensors.
    scan_layers: return the scanned layout (encoder layers stacked under `layers`).
    **config_overrides: BertConfig fields to set (dtype, remat_policy, dropout...).
  """
  path = pathlib.Path(path)
  hf_config = json.loads((path / "config.json").read_text())
  cfg = model.BertConfig.from_hf_dict(hf_config, scan_layers=scan_layers, **config_overrides)
  return cfg, from_state_dict(cfg, read_safetensors(path), scan_layers=scan_layers,
                              model_type=hf_config.get("model_type"))


def saved_pooler(path) -> bool:
  """Whether the Hugging Face directory `path` saved a pooler (`load_hf` makes up a fresh one where it did
  not: MaskedLM, token classification and QA classes, every ELECTRA and DistilBERT class; a RoBERTa sequence
  classifier's is its head's first layer). Reads the safetensors headers only."""
  path = pathlib.Path(path)
  index = path / "model.safetensors.index.json"
  if index.exists():
    names = json.loads(index.read_text())["weight_map"]
  else:
    with open(path / "model.safetensors", "rb") as f:
      names = json.loads(f.read(int.from_bytes(f.read(8), "little")))
  # RobertaForSequenceClassification saves ours as its head's `classifier.dense` (ROBERTA_SEQUENCE_HEAD).
  return any("pooler" in name.split(".") or name.startswith("classifier.dense.") for name in names)


def read_safetensors(path: pathlib.Path) -> dict:
  """All tensors of `model.safetensors`, or of the shards listed in `model.safetensors.index.json`."""
  index = path / "model.safetensors.index.json"
  if index.exists():
    shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    return {k: v for shard in shards for k, v in load_safetensors(path / shard).items()}
  weights = path / "model.safetensors"
  if not weights.exists():
    raise FileNotFoundError(f"{weights} not found (only safetensors checkpoints are read)")
  return load_safetensors(weights)


def load_safetensors(file) -> dict:
  """{name: numpy array} of one .safetensors file, bfloat16 tensors included (as ml_dtypes.bfloat16).

  The format: an 8-byte little-endian header size, a JSON header {name: {dtype, shape, data_offsets}},
  then the tensors' bytes.
  """
  data = memoryview(pathlib.Path(file).read_bytes())  # slices of it are views, not copies
  size = int.from_bytes(data[:8], "little")
  header = json.loads(bytes(data[8:8 + size]))
  header.pop("__metadata__", None)
  tensors = {}
  for name, info in header.items():
    if info["dtype"] not in _SAFETENSORS_DTYPES:
      raise ValueError(f"{file}: tensor {name} has unsupported dtype {info['dtype']}")
    start, end = info["data_offsets"]
    buffer = data[8 + size + start:8 + size + end]
    tensors[name] = np.frombuffer(buffer, _SAFETENSORS_DTYPES[info["dtype"]]).reshape(info["shape"])
  return tensors


def save_hf(path, cfg: model.BertConfig, params: dict, vocab_file=None, config_fields: dict | None = None,
            pooler: bool | None = None, model_type: str | None = None, tokenizer=None) -> None:
  """Writes config.json, model.safetensors and (if given) vocab.txt, loadable by transformers.

  The class (config.json `architectures`) is the family's encoder (`BertModel` ...) without heads, its
  pretraining class (`BertForPreTraining`, `AlbertForPreTraining`, `RobertaForMaskedLM`,
  `DistilBertForMaskedLM`; ALBERT without a sentence-order head: `AlbertForMaskedLM`) with an MLM head. A
  family without a pooler (ELECTRA, DistilBERT) never gets one written.

  Args:
    config_fields: set in config.json over ours (a head's `architectures`, `id2label`, `label2id` ...).
    pooler: whether to write the pooler; None: as the class written has one (MaskedLM classes have none).
    tokenizer: the tokenizer written beside it: config.json's special-token ids (`pad_token_id`, ...) are its
      own where the family's config has them (ModernBERT's defaults are its 50k vocabulary's ids), but for a
      pad id that is the model's position offset (RoBERTa's).
    model_type: the family to write as; None: `cfg.model_type`, or "electra" where `params` hold a
      "discriminator" head, which only ELECTRA has (its `cfg` reads as ALBERT's, embeddings factorized).
      "electra": `ElectraForPreTraining` with a "discriminator" head, `ElectraForMaskedLM` with an "mlm" head
      (never a pooler).
  """
  if model_type is None and "discriminator" in params:   # `load_hf` of an ELECTRA discriminator gives these
    model_type = "electra"
  if cfg.model_type == "albert" and (cfg.embedding_size is None or cfg.causal):
    raise ValueError("transformers' ALBERT always projects its embeddings (set embedding_size) and has no "
                     "causal mask")
  path = pathlib.Path(path)
  path.mkdir(parents=True, exist_ok=True)
  hf_config = electra_hf_dict(cfg) if model_type == "electra" else cfg.to_hf_dict()
  hf_config["architectures"] = [_architecture(cfg, params, model_type)]
  if tokenizer is not None:
    ids = {"pad_token_id": tokenizer.pad_id, "cls_token_id": tokenizer.cls_id, "sep_token_id": tokenizer.sep_id,
           "bos_token_id": tokenizer.cls_id, "eos_token_id": tokenizer.sep_id}   # [CLS]/<s> open, [SEP]/</s> close
    if cfg.position_pad_id is not None:   # RoBERTa's pad id is its positions' offset too: the model's, kept
      del ids["pad_token_id"]
    hf_config.update({k: v for k, v in ids.items() if k in hf_config})
  hf_config.update(config_fields or {})
  if pooler is None:
    pooler = not hf_config["architectures"][0].endswith("ForMaskedLM")
  state = to_state_dict(cfg, params, pooler, model_type)
  (path / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
  save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
  if vocab_file is not None:
    shutil.copyfile(vocab_file, path / "vocab.txt")


def _architecture(cfg: model.BertConfig, params: dict, model_type: str | None = None) -> str:
  fam = hf_families.family(cfg, model_type)
  if "discriminator" in params:
    return f"{fam.classes}ForPreTraining"
  if "mlm" not in params and "nsp" not in params:
    return f"{fam.classes}Model"
  return fam.pretraining if "nsp" in params else fam.masked_lm

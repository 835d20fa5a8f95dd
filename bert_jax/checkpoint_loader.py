"""Every checkpoint a user may name, found by one rule: its model config, params and tokenizer.

    cfg, params, tok = checkpoint_loader.load("runs/bert_tiny")   # params {"bert", "mlm", "nsp"}

A path is, checked in this order:
  * a Hugging Face directory: config.json (+ model.safetensors), read by `checkpoints_hf`;
  * a Google TF checkpoint: a `*.ckpt` prefix, or a directory holding one (`*.index`), with
    bert_config.json beside it, read by `checkpoints_tf`;
  * a bert_jax (orbax) checkpoint: a pretraining workdir, its `checkpoints/` or `checkpoints/<step>`; a
    finetuned workdir, its `best/` or `best/<step>`. Its config is the bert_config.json of the nearest
    directory above the steps: the workdir, where pretraining writes it at start (`write_run_record`)
    and so does finetuning.
The tokenizer (vocab.txt, a SentencePiece *.model, or a byte-level BPE vocab.json + merges.txt) and
tokenizer_config.json (`do_lower_case` and the tokenizer's settings) are read from the directory that holds
the config. Params come back as host numpy arrays: the encoder under "bert" and whatever heads were saved
("mlm", "nsp", a finetuned head). `family_problem` says when a checkpoint holds another encoder than a
config describes.
"""

import dataclasses
import json
import os
import tempfile
from typing import Any, NamedTuple

from etils import epath
import jax

from bert_jax.models import encoder as model
from bert_jax import failures
from bert_jax import paths
from bert_jax.data import tokenizer as tokenizer_lib

KINDS = ("hf", "tf", "bert_jax")
HF_CONFIG, CONFIG, TOKENIZER_CONFIG = "config.json", "bert_config.json", "tokenizer_config.json"
# Where a workdir keeps its orbax checkpoints: pretraining (train.py), finetuning's best (finetune/trainer.py).
_RUN_CHECKPOINTS = ("checkpoints", "best")
_LOOKED_FOR = ("a Hugging Face directory (config.json + model.safetensors), a Google TF checkpoint (a *.ckpt "
               "prefix or a directory holding *.index, with bert_config.json), a bert_jax pretraining run (its "
               "workdir, checkpoints/ or checkpoints/<step>) or a finetuned workdir (or its best/)")


@dataclasses.dataclass(frozen=True)
class Found:
  """A located checkpoint."""
  kind: str        # one of KINDS
  checkpoint: str  # what its reader takes: the HF directory, TF prefix or directory, orbax directory or <dir>/<step>
  directory: str   # the directory holding its config and tokenizer


class Loaded(NamedTuple):
  config: model.BertConfig
  params: dict
  tokenizer: Any


def find(path, kind: str = "auto") -> Found:
  """Where `path` (as a user types it) keeps its weights, config and tokenizer.

  Args:
    path: a checkpoint as the module docstring lists.
    kind: "auto" (detect), or one of KINDS to skip detection.
  Raises:
    FileNotFoundError: `path` does not exist. failures.UserError (a ValueError): it is none of the kinds.
  """
  if kind not in ("auto",) + KINDS:
    raise failures.UserError(f"checkpoint kind {kind!r}: one of auto, {', '.join(KINDS)}")
  path = paths.absolute(str(path))   # orbax wants absolute paths
  p = epath.Path(path)
  tf_prefix = epath.Path(path + ".index").exists()
  if not p.exists() and not tf_prefix:
    raise FileNotFoundError(f"checkpoint {path} does not exist")
  if kind == "hf" or (kind == "auto" and (p / HF_CONFIG).exists()):
    return Found("hf", path, path)
  if kind == "tf" or (kind == "auto" and (tf_prefix or (p.is_dir() and any(p.glob("*.index"))))):
    return Found("tf", path, path if p.is_dir() else str(p.parent))
  orbax = _orbax_checkpoint(p)
  if orbax is None:
    raise failures.UserError(f"{path} is not a checkpoint: looked for {_LOOKED_FOR}")
  steps = orbax if not _is_step(orbax) else orbax.parent
  directory = next((d for d in (steps, steps.parent) if (d / CONFIG).exists()), steps.parent)
  return Found("bert_jax", str(orbax), str(directory))


def _is_step(p: epath.Path) -> bool:
  return p.name.isdigit() and (p / "state").is_dir()   # <step>/state: checkpointing.Checkpointer's item


def _has_steps(p: epath.Path) -> bool:
  return p.is_dir() and any(_is_step(c) for c in p.iterdir())


def _orbax_checkpoint(p: epath.Path) -> epath.Path | None:
  """A step, a directory of steps, or a workdir's directory of steps; None if none."""
  if _is_step(p) or _has_steps(p):
    return p
  return next((p / d for d in _RUN_CHECKPOINTS if _has_steps(p / d)), None)


def _config_file(found: Found, bert_config_json: str | None) -> epath.Path:
  config = epath.Path(bert_config_json or os.path.join(found.directory, CONFIG))
  if not config.exists():
    raise FileNotFoundError(
        f"{found.checkpoint}: a {found.kind} checkpoint without its model config {config}; give its "
        "bert_config.json (finetuning: config.bert_config_json). Pretraining runs write one into the workdir "
        "at start (checkpoint_loader.write_run_record).")
  return config


def load_model(path, *, kind: str = "auto", bert_config_json: str | None = None, scan_layers: bool = False,
               **config_overrides) -> tuple[model.BertConfig, dict]:
  """(BertConfig, params) of the checkpoint at `path`; see `load`."""
  return _read_model(find(path, kind), bert_config_json, scan_layers, config_overrides)


def _read_model(found: Found, bert_config_json, scan_layers: bool, config_overrides: dict) -> tuple:
  if found.kind == "hf":
    from bert_jax.interop import checkpoints_hf  # pylint: disable=g-import-not-at-top
    cfg, params = checkpoints_hf.load_hf(found.checkpoint, **config_overrides)
  elif found.kind == "tf":
    from bert_jax.interop import checkpoints_tf  # pylint: disable=g-import-not-at-top
    config = _config_file(found, bert_config_json)
    cfg, params = checkpoints_tf.load_tf(found.checkpoint, str(config), **config_overrides)
  else:
    from bert_jax import checkpointing  # pylint: disable=g-import-not-at-top
    hf_dict = json.loads(_config_file(found, bert_config_json).read_text())
    cfg = model.BertConfig.from_hf_dict(hf_dict, **config_overrides)
    params = checkpointing.restore_params(found.checkpoint)
  if "bert" not in params:
    raise ValueError(f"{found.checkpoint}: no encoder params ('bert') in the checkpoint, only {sorted(params)}")
  # Either layout in, the asked layout out (both functions leave the other layout unchanged).
  params = model.scan_params(params) if scan_layers else model.unscan_params(params)
  return dataclasses.replace(cfg, scan_layers=scan_layers), params


def hf_model_type(path) -> str | None:
  """The `model_type` in a Hugging Face directory's config.json ("bert", "electra" ...); None for the other
  kinds. ELECTRA needs it: its encoder's config reads as BERT's or ALBERT's."""
  found = find(path)
  if found.kind != "hf":
    return None
  return json.loads((epath.Path(found.directory) / HF_CONFIG).read_text()).get("model_type")


def saved_pooler(path, params: dict | None = None) -> bool:
  """Whether the checkpoint's pooler is one that was trained or saved as such. False for a Hugging Face
  directory that saved no pooler (MaskedLM, token and QA classes, ELECTRA, DistilBERT): `load` gives it a newly
  initialised one. False for a bert_jax pretraining run (`params` given) without a sentence-pair head (NSP,
  ALBERT's SOP): only that head trains the pooler (RoBERTa's, SpanBERT's and the left-to-right objectives carry
  it untrained). True otherwise: the other kinds' params are what was saved (a bert_jax ELECTRA or DistilBERT
  run's encoder has no "pooler"; a finetuned workdir's pooler is its classifier's or its checkpoint's)."""
  found = find(path)
  if found.kind == "hf":
    from bert_jax.interop import checkpoints_hf  # pylint: disable=g-import-not-at-top
    return checkpoints_hf.saved_pooler(found.checkpoint)
  from bert_jax.finetune import task_record  # pylint: disable=g-import-not-at-top  (it imports this module)
  finetuned = (epath.Path(found.directory) / task_record.TASK_FILE).exists()
  if found.kind == "bert_jax" and params is not None and not finetuned:
    return "nsp" in params
  return True   # what was read is what was saved: the caller sees whether params["bert"] has a "pooler"


def lower_case(path) -> bool:
  """The checkpoint's tokenizer_config.json `do_lower_case` (cased models say False); True without one."""
  return _lower_case(find(path).directory)


def _lower_case(directory: str) -> bool:
  config = epath.Path(directory) / TOKENIZER_CONFIG
  return bool(json.loads(config.read_text()).get("do_lower_case", True)) if config.exists() else True


def load_tokenizer(path, do_lower_case: bool | None = None, vocab: str | None = None):
  """The checkpoint's tokenizer, or `vocab`'s (a vocab.txt, *.model, vocab.json or tokenizer.json, or a directory
  holding one) where given; `do_lower_case` None: as the checkpoint's tokenizer_config.json says.

  Raises FileNotFoundError when there is no `vocab` and the checkpoint's directory holds no tokenizer (the
  message says to give one).
  """
  return _read_tokenizer(find(path), do_lower_case, vocab)


def load_vocab(vocab: str, do_lower_case: bool | None, checkpoint_directory: str | None):
  """The tokenizer of `vocab` (a file, or a folder holding one), given beside or instead of a checkpoint's;
  `do_lower_case` None: as the tokenizer_config.json beside the file (in the folder) says, else the checkpoint's
  (in `checkpoint_directory`), else True."""
  if do_lower_case is None:
    directory = vocab if os.path.isdir(vocab) else os.path.dirname(vocab)
    do_lower_case = tokenizer_lib.read_tokenizer_config(directory).get("do_lower_case")
  if do_lower_case is None:
    do_lower_case = _lower_case(checkpoint_directory) if checkpoint_directory else True
  return tokenizer_lib.load_tokenizer(vocab, bool(do_lower_case))


def _read_tokenizer(found: Found, lower: bool | None, vocab: str | None = None):
  if vocab:
    return load_vocab(vocab, lower, found.directory)
  lower = _lower_case(found.directory) if lower is None else lower
  try:
    return tokenizer_lib.load_tokenizer(found.directory, lower)
  except FileNotFoundError as e:
    raise FileNotFoundError(f"{e}: give the vocabulary the model was trained with (`vocab=` in Python, --vocab "
                            "for embed, fill-mask and export, --config.vocab_file for finetuning)") from None


def load(path, *, kind: str = "auto", bert_config_json: str | None = None, scan_layers: bool = False,
         do_lower_case: bool | None = None, vocab: str | None = None, **config_overrides) -> Loaded:
  """(config, params, tokenizer) of the checkpoint at `path`.

  Args:
    path: a checkpoint as the module docstring lists; relative paths are from the working directory.
    kind: "auto", or one of KINDS to skip detection.
    bert_config_json: the model config of a TF or bert_jax checkpoint, if not the one beside it.
    scan_layers: the params' layout (encoder layers stacked under `layers`), also set in the config.
    do_lower_case: the tokenizer's; None: as the checkpoint's tokenizer_config.json says, else True.
    vocab: the tokenizer's file (or a directory holding one) where the checkpoint's directory holds none, or
      another; None: the checkpoint's.
    **config_overrides: BertConfig fields to set (dtype, remat_policy, dropout...).
  Returns:
    Loaded(config, params as host numpy arrays {"bert", plus the saved heads}, tokenizer).
  """
  found = find(path, kind)
  tokenizer = _read_tokenizer(found, do_lower_case, vocab)   # before the weights: a missing one fails at once
  cfg, params = _read_model(found, bert_config_json, scan_layers, config_overrides)
  if vocab:
    check_vocab_fits(tokenizer, cfg, vocab)
  return Loaded(cfg, params, tokenizer)


def check_vocab_fits(tokenizer, cfg: model.BertConfig, vocab: str) -> None:
  """A ValueError where the tokenizer given as `vocab` has more tokens than `cfg`'s embedding table: its ids past
  the table would embed as NaN or garbage."""
  if tokenizer.vocab_size > cfg.vocab_size:
    raise ValueError(f"the tokenizer of {vocab} ({tokenizer.source_file}) has {tokenizer.vocab_size} tokens but "
                     f"the model's embedding table has {cfg.vocab_size}: give the vocabulary the model was trained "
                     "with")


# The fields that make an encoder's parameters and attention what they are: a checkpoint that differs in one
# cannot initialise the model (or, worse, would, as another architecture; the GELU's form among them, so that
# a phase 2 does not continue a phase 1 under another activation). RoPE's bases are not among them: whether
# there is RoPE is (`rope`: no position table), but a longer context's phase raises the base on purpose
# (ModernBERT's extension, 10k -> 160k), and an unset local base is the global one.
_STRUCTURE = ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size", "max_position_embeddings",
              "type_vocab_size", "embedding_size", "share_layers", "shared_sublayer", "position_pad_id", "causal",
              "rope", "geglu", "pre_norm", "final_norm", "norm_bias", "dense_bias",
              "global_attn_every_n_layers", "local_attention", "pruned_heads", "hidden_act")
# Numbers the parameters were trained under, named with both values where they differ.
_TRAINED_UNDER = ("layer_norm_eps",)


def _structure(cfg: model.BertConfig, field: str):
  return cfg.rope_theta is not None if field == "rope" else getattr(cfg, field)


def family_problem(path, encoder_config: model.BertConfig) -> str | None:
  """Why the checkpoint at `path` cannot initialise `encoder_config`'s encoder: its model config names another
  family (bert, albert, roberta, modernbert ...), switch (embedding_size, share_layers, position_pad_id, causal,
  ModernBERT's) or size.

  Returns:
    One sentence naming both encoders; None if they agree, or if `path` is no checkpoint with a model config
    (what is missing is for the checks that read it to say).
  """
  try:
    found = find(path)
    config = epath.Path(found.directory) / HF_CONFIG if found.kind == "hf" else _config_file(found, None)
    if found.kind == "tf":
      from bert_jax.interop import checkpoints_tf  # pylint: disable=g-import-not-at-top
      hf_dict = checkpoints_tf.config_dict(config)
    else:
      hf_dict = json.loads(config.read_text())
  except (FileNotFoundError, ValueError):
    return None
  try:
    cfg = model.BertConfig.from_hf_dict(hf_dict)
  except ValueError as e:
    return f"{path} holds an encoder bert_jax does not implement: {e}"
  differ = [f for f in _STRUCTURE if _structure(cfg, f) != _structure(encoder_config, f)]
  differ += [f"{f} ({getattr(cfg, f):g} in the checkpoint, {getattr(encoder_config, f):g} in the config: set "
             f"--config.model.{f}={getattr(cfg, f):g})"
             for f in _TRAINED_UNDER if getattr(cfg, f) != getattr(encoder_config, f)]
  if not differ:
    return None
  return (f"{path} holds {describe(cfg, hf_dict.get('model_type'))} but the config describes "
          f"{describe(encoder_config)}: they differ in "
          f"{', '.join(differ)}")


def describe(cfg: model.BertConfig, family: str | None = None) -> str:
  """`cfg`'s family (`family`, else `cfg.model_type`: an ELECTRA config reads as BERT's or ALBERT's) and
  structure in words, e.g. "an albert encoder (L=12 H=768 A=12 I=3072 E=128, shared layers, vocab 30000, 512
  positions, 2 token types)"."""
  shape = f"L={cfg.num_layers} H={cfg.hidden_size} A={cfg.num_heads} I={cfg.intermediate_size}"
  if cfg.embedding_size is not None:
    shape += f" E={cfg.embedding_size}"
  switches = [s for s, on in (("shared layers", cfg.share_layers), ("causal", cfg.causal),
                              (f"positions after pad id {cfg.position_pad_id}", cfg.position_pad_id is not None),
                              (f"RoPE base {cfg.rope_theta}", cfg.rope_theta is not None), ("GeGLU", cfg.geglu),
                              ("pre-norm", cfg.pre_norm), ("final norm", cfg.final_norm),
                              ("LayerNorms without bias", not cfg.norm_bias),
                              ("projections without bias", not cfg.dense_bias),
                              (f"a global layer every {cfg.global_attn_every_n_layers}, window {cfg.local_attention}",
                               cfg.local_attention is not None))
              if on]
  sizes = [f"vocab {cfg.vocab_size}", f"{cfg.max_position_embeddings} positions",
           f"{cfg.type_vocab_size} token type{'s' if cfg.type_vocab_size != 1 else ''}"]
  family = family or cfg.model_type
  article = "an" if family[0] in "aeiou" else "a"
  return f"{article} {family} encoder ({', '.join([shape, *switches, *sizes])})"


def write_run_record(workdir: str, model_config: model.BertConfig, vocab_path: str, do_lower_case: bool) -> None:
  """Writes what `load` reads beside a run's checkpoints: bert_config.json, the tokenizer's files and
  tokenizer_config.json (`do_lower_case` and the tokenizer's settings). Process 0 writes; the other
  processes return.

  Args:
    workdir: the run's directory (local or remote, e.g. gs://).
    model_config: the model trained.
    vocab_path: vocab.txt, a SentencePiece *.model, a byte-level BPE vocab.json (merges.txt beside it), or
      a directory holding one (a prepared data directory).
    do_lower_case: whether text is lowercased before tokenizing.
  """
  if jax.process_index() != 0:
    return
  root = epath.Path(workdir)
  root.mkdir(parents=True, exist_ok=True)
  (root / CONFIG).write_text(json.dumps(model_config.to_hf_dict(), indent=2) + "\n")
  tokenizer = tokenizer_lib.load_tokenizer(vocab_path, do_lower_case)
  with tempfile.TemporaryDirectory() as local:
    # The tokenizer's `save` writes all it reloads from (vocab.txt; spm.model; vocab.json, merges.txt and
    # its tokenizer_config.json settings); then on to a possibly remote workdir.
    tokenizer.save(local)
    settings = tokenizer_settings(local, do_lower_case)
    for saved in epath.Path(local).iterdir():
      if saved.name != TOKENIZER_CONFIG:
        saved.copy(root / saved.name, overwrite=True)
  (root / TOKENIZER_CONFIG).write_text(json.dumps(settings, indent=2) + "\n")


def check_run_model(workdir: str, model_config: model.BertConfig) -> None:
  """Stops a pretraining run whose workdir holds checkpoints of another model (the `bert_config.json` beside
  them describes another structure: `_STRUCTURE`'s fields; dropout and initialisation may change on resume),
  before the run prepares data or writes its record over that run's (`write_run_record`)."""
  model_config.to_hf_dict()   # a config with no such record stops here, before the data are prepared
  root = epath.Path(workdir)
  if not (root / CONFIG).exists() or not _has_steps(root / _RUN_CHECKPOINTS[0]):
    return
  try:
    theirs = model.BertConfig.from_hf_dict(json.loads((root / CONFIG).read_text()))
  except ValueError:   # a record this version cannot read: the restore decides
    return
  differ = [f for f in _STRUCTURE if _structure(theirs, f) != _structure(model_config, f)]
  if differ:
    raise failures.UserError(f"{workdir} holds the checkpoints of another model ({describe(theirs)}; "
                             f"{', '.join(differ)} differ): give another --workdir, or remove that directory "
                             "to start over")


def tokenizer_settings(directory: str, do_lower_case: bool) -> dict:
  """The tokenizer_config.json of a tokenizer as its `save` wrote it into `directory` (SentencePiece's
  accents and spaces, the BPE's settings), with the casing, which the loader takes from the checkpoint."""
  return {**tokenizer_lib.read_tokenizer_config(directory), "do_lower_case": do_lower_case}

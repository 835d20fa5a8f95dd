"""DistilBERT (Sanh et al. 2019): a student learns from a frozen teacher's MLM distribution.

Loss = 5.0 x soft cross-entropy at temperature T = 2 between the student's and the teacher's MLM
distributions at every real token (times T^2) + 2.0 x the student's MLM loss at the masked positions
+ 1.0 x cosine loss (1 - cos) between the two last hidden states at every real token: the coefficients,
temperature and reductions of Hugging Face's released `examples/research_projects/distillation`
(`distiller.py`: `alpha_ce`, `alpha_mlm`, `alpha_cos`; `restrict_ce_to_mask` off, as by default;
`distill.soft_positions = "masked"` turns it on). The soft term is a
cross-entropy, not the KL divergence the release logs: they differ by the teacher's entropy, which takes
no gradient, and `distill_kl` is reported beside it. Dynamic masking, no NSP (one-segment formats).

The teacher is any checkpoint `checkpoint_loader` reads (a Hugging Face directory, a Google TF checkpoint,
a bert_jax run) that kept its MLM head: `config.distill.teacher`. It is the model's "frozen" collection
(`base.Frozen`): sharded like the student by its logical axis names, in the compute dtype, never in the
optimizer state or the student's checkpoint, and read under stop_gradient. The student (`config.model`:
no token types, `type_vocab_size` 0, and no pooler) has the teacher's hidden size and vocabulary; a new run
starts it from the teacher's embeddings, MLM head and layers round(linspace(0, L_teacher - 1, L_student))
(for 12 -> 6: 0, 2, 4, 7, 9, 11, the layers of the release's `scripts/extract_distilbert.py`), or from
`config.distill.student_layers` when set. Params: {"bert": student encoder, "mlm": its head}, so
finetune, embed, export and fill-mask read the student as any MLM checkpoint.
"""

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bert_jax import flops
from bert_jax.models import encoder
from bert_jax.models import heads
from bert_jax.objectives import base
from bert_jax.objectives import bert

LOSS_TERMS = {"soft": 5.0, "mlm": 2.0, "cos": 1.0}   # alpha_ce, alpha_mlm, alpha_cos of the release
HAS_MLM_HEAD = True
DEFAULT_TEMPERATURE = 2.0
_ENCODER_INPUTS = ("position_ids", "example_ids")


def batch_schema(d: ml_collections.ConfigDict, batch_size: int) -> dict[str, base.Field]:
  """BERT's token and MLM fields; no sentence labels."""
  return {**base.token_fields(d, batch_size), **base.masked_lm_fields(d, batch_size)}


def _distill(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  return config.get("distill") or ml_collections.ConfigDict()


def temperature(config: ml_collections.ConfigDict) -> float:
  return float(_distill(config).get("temperature", DEFAULT_TEMPERATURE))


def soft_at_masked(config) -> bool:
  """Whether the soft targets are taken at the masked positions only (the release's `restrict_ce_to_mask`:
  both vocabulary projections shrink from L to P rows) rather than at every real token (its default)."""
  return config is not None and _distill(config).get("soft_positions", "all") == "masked"


def validate(config: ml_collections.ConfigDict) -> list[str]:
  """What can be checked without reading the teacher (`check_inputs` reads it)."""
  problems = base.format_problems(config.data, base.SINGLE_FORMATS, "distilbert")
  if _distill(config).get("soft_positions", "all") not in ("all", "masked"):
    problems.append(f"distill.soft_positions {_distill(config).soft_positions!r}: one of 'all', 'masked'")
  if temperature(config) <= 0:
    problems.append(f"distill.temperature {temperature(config)} must be > 0")
  if not _distill(config).get("teacher") and not _distill(config).get("teacher_preset"):
    problems.append("distill.teacher is empty: name the teacher checkpoint (a Hugging Face directory, a "
                    "Google TF checkpoint or a bert_jax run that kept its MLM head)")
  layers = _distill(config).get("student_layers")
  cfg = base.encoder_config(config)
  if layers and len(layers) != cfg.num_layers:
    problems.append(f"distill.student_layers {tuple(layers)} names {len(layers)} teacher layers for a student "
                    f"of {cfg.num_layers} layers")
  if layers and any(not isinstance(i, int) or i < 0 for i in layers):
    problems.append(f"distill.student_layers {tuple(layers)}: teacher layers are numbered from 0")
  if layers and not _distill(config).get("teacher") and _distill(config).get("teacher_preset"):
    problems += _layers_past(layers, teacher_config(config).num_layers)
  return problems


def _layers_past(layers, depth: int) -> list[str]:
  """The problem of `student_layers` naming layers a teacher of `depth` layers does not have: scanned,
  indexing its stacked layers would clamp them to the last one; unrolled, a KeyError."""
  if missing := [i for i in layers or () if i >= depth]:
    return [f"distill.student_layers names teacher layers {missing} of a teacher of {depth} layers "
            f"(0 to {depth - 1})"]
  return []


# -- The teacher ---------------------------------------------------------------------------------


@functools.cache
def _read_teacher(path: str, scan_layers: bool) -> tuple:
  """(BertConfig, host params {"bert", "mlm"}) of a teacher checkpoint, read once per process."""
  from bert_jax import checkpoint_loader  # pylint: disable=g-import-not-at-top
  cfg, params = checkpoint_loader.load_model(path, scan_layers=scan_layers)
  return cfg, params


def teacher_config(config: ml_collections.ConfigDict) -> encoder.BertConfig:
  """The teacher's encoder config: its checkpoint's (`distill.teacher`), else `distill.teacher_preset` (a
  preset size at the student's vocabulary: compile-only uses, `aot` and `bench train`). Its params are
  stored in the compute dtype and it runs without dropout."""
  d, student = _distill(config), base.encoder_config(config)
  if d.get("teacher"):
    cfg = _read_teacher(d.teacher, student.scan_layers)[0]
  else:
    cfg = encoder.BertConfig.from_preset(d.teacher_preset, vocab_size=student.vocab_size,
                                         max_position_embeddings=student.max_position_embeddings)
  return dataclasses.replace(cfg, dtype=student.dtype, param_dtype=student.dtype, scan_layers=student.scan_layers,
                             scan_unroll=student.scan_unroll, remat_policy="none", hidden_dropout=0.0,
                             attention_dropout=0.0)


def teacher_problems(config: ml_collections.ConfigDict, tokenizer=None) -> list[str]:
  """A teacher that cannot be read, has no MLM head, or whose vocabulary, width or positions differ from
  the student's (the soft targets and cosine loss compare them token by token, unit by unit)."""
  d, student = _distill(config), base.encoder_config(config)
  if not d.get("teacher"):
    return ["distill.teacher is empty: pretraining a student needs the teacher checkpoint"]
  try:
    cfg, params = _read_teacher(d.teacher, student.scan_layers)
  except (OSError, ValueError, KeyError) as e:
    return [f"distill.teacher {d.teacher!r} cannot be read: {str(e).splitlines()[0]}"]
  problems = []
  if "mlm" not in params:
    problems.append(f"distill.teacher {d.teacher!r} has no MLM head (a checkpoint saved without it): the soft "
                    "targets are its MLM distribution")
  for field, what in (("vocab_size", "vocabulary"), ("hidden_size", "hidden size"),
                      ("max_position_embeddings", "positions")):
    if getattr(cfg, field) != getattr(student, field):
      problems.append(f"the teacher's {what} ({field} {getattr(cfg, field)}) differs from the student's "
                      f"({getattr(student, field)}): set --config.model.{field}={getattr(cfg, field)}")
  if tokenizer is not None and not problems:
    problems += _tokenizer_problems(d.teacher, tokenizer)
  if not d.get("student_layers") and student.num_layers > cfg.num_layers:
    problems.append(f"a student of {student.num_layers} layers is deeper than its teacher ({cfg.num_layers})")
  problems += _layers_past(d.get("student_layers"), cfg.num_layers)
  if not problems:
    for field in ("num_heads", "intermediate_size", "embedding_size", "position_pad_id", "hidden_act"):
      if getattr(cfg, field) != getattr(student, field):
        problems.append(f"the student starts from the teacher's layers but its {field} "
                        f"{getattr(student, field)} differs from the teacher's {getattr(cfg, field)}")
  return problems


def input_problems(config: ml_collections.ConfigDict) -> list[str]:
  """Before compiling (`run_checks.check_inputs`): the teacher against the student and the data's tokenizer."""
  d = config.data
  if d.train_files.startswith("embedded:"):
    return [f"data.train_files {d.train_files!r} is prepared with a newly trained vocabulary, not the teacher's: "
            "prepare the corpus with `bert-jax prepare --vocab_file=<the teacher's vocabulary>`"]
  from bert_jax.data import input_pipeline  # pylint: disable=g-import-not-at-top
  try:
    tokenizer = input_pipeline.load_tokenizer(d)
  except (OSError, ValueError):
    tokenizer = None   # check_inputs names the unreadable data
  return teacher_problems(config, tokenizer)


def _tokenizer_problems(teacher: str, tokenizer) -> list[str]:
  """The data's tokenizer must map text to the ids the teacher was trained on."""
  from bert_jax import checkpoint_loader  # pylint: disable=g-import-not-at-top
  try:
    theirs = checkpoint_loader.load_tokenizer(teacher)
  except (OSError, ValueError) as e:
    return [f"the teacher's tokenizer cannot be read ({str(e).splitlines()[0]}): the data must be tokenized "
            "with the teacher's vocabulary"]
  vocab = lambda t: list(t.convert_ids_to_tokens(range(t.vocab_size)))
  ours, want = vocab(tokenizer), vocab(theirs)
  if ours != want:
    first = next((i for i, (a, b) in enumerate(zip(ours, want)) if a != b), min(len(ours), len(want)))
    return [f"the data's vocabulary ({len(ours)} tokens) is not the teacher's ({len(want)}); they first differ "
            f"at id {first}: prepare the data with the teacher's vocabulary (bert-jax prepare --vocab_file=...)"]
  return []


class TeacherMLM(nn.Module):
  """A teacher encoder (no pooler) and its MLM head at every position, or at `masked_lm_positions` when
  `at_masked`: params {"bert", "mlm"}."""
  config: encoder.BertConfig
  at_masked: bool = False

  @nn.compact
  def __call__(self, batch: dict) -> dict:
    bert_encoder = encoder.BertEncoder(self.config, name="bert")
    out = bert_encoder(batch["input_ids"], batch["input_mask"], jnp.zeros_like(batch["input_ids"]), pool=False,
                       **{k: batch[k] for k in _ENCODER_INPUTS if k in batch})
    x = out["sequence_output"]
    if self.at_masked:
      x = heads.gather_positions(x, batch["masked_lm_positions"])
    logits = heads.MaskedLMHead(self.config, name="mlm")(x, bert_encoder.word_embeddings())
    return {"mlm_logits": logits, "sequence_output": out["sequence_output"]}


def _teacher_batch(cfg: encoder.BertConfig, length: int) -> dict:
  ids = jnp.zeros((1, length), jnp.int32)
  return {"input_ids": ids, "input_mask": ids}


def frozen(config: ml_collections.ConfigDict) -> base.Frozen:
  """The teacher as the model's frozen collection {"teacher": {"bert", "mlm"}}."""
  cfg, length = teacher_config(config), config.data.seq_length

  def init(rng):
    return {"teacher": TeacherMLM(cfg).init(rng, _teacher_batch(cfg, length))["params"]}

  def load():
    params = _read_teacher(_distill(config).teacher, cfg.scan_layers)[1]
    bert_params = {k: v for k, v in params["bert"].items() if k != "pooler"}
    return jax.tree.map(lambda a: np.asarray(a).astype(cfg.param_dtype),
                        {"teacher": {"bert": bert_params, "mlm": params["mlm"]}})

  return base.Frozen(init=init, load=load,
                     init_params=functools.partial(student_from_teacher, layers=student_layers(config, cfg)))


def student_layers(config: ml_collections.ConfigDict, teacher_cfg: encoder.BertConfig) -> tuple[int, ...]:
  """The teacher layer each student layer starts from (see the module docstring)."""
  layers = _distill(config).get("student_layers")
  if layers:
    return tuple(int(i) for i in layers)
  n = base.encoder_config(config).num_layers
  return tuple(int(i) for i in np.round(np.linspace(0, teacher_cfg.num_layers - 1, n)))


def student_from_teacher(params: dict, frozen_vars: dict, layers: tuple[int, ...]) -> dict:
  """The student's params with the teacher's word and position embeddings, embedding LayerNorm, MLM head
  and layers `layers` (unscanned `layer_i` or scanned `layers` alike). Token types and pooler: none."""
  teacher = frozen_vars["teacher"]
  cast = lambda new, old: jax.tree.map(lambda n, o: n.astype(o.dtype), new, old)
  student = jax.tree.map(lambda x: x, params)   # a new dict tree, same leaves
  emb = dict(student["bert"]["embeddings"])
  for name in ("word_embeddings", "position_embeddings", "layer_norm"):
    emb[name] = cast(teacher["bert"]["embeddings"][name], emb[name])
  student["bert"]["embeddings"] = emb
  t_layers, s_layers = teacher["bert"]["encoder"], dict(student["bert"]["encoder"])
  if "layers" in s_layers:
    picked = jax.tree.map(lambda x: x[jnp.asarray(layers)], t_layers["layers"])
    s_layers["layers"] = cast(picked, s_layers["layers"])
  else:
    for i, j in enumerate(layers):
      s_layers[f"layer_{i}"] = cast(t_layers[f"layer_{j}"], s_layers[f"layer_{i}"])
  student["bert"]["encoder"] = s_layers
  student["mlm"] = cast(teacher["mlm"], student["mlm"])
  return student


# -- The model and loss ----------------------------------------------------------------------------


class DistilBertForPreTraining(nn.Module):
  """The student (encoder without pooler + MLM head at every position) and, read from the "frozen"
  collection, the teacher's MLM logits and last hidden states under stop_gradient."""
  config: encoder.BertConfig
  teacher_config: encoder.BertConfig
  at_masked: bool = False   # logits at the masked positions only (`soft_at_masked`)

  @nn.compact
  def __call__(self, batch: dict, *, deterministic: bool = True) -> dict:
    """Returns student and teacher {"mlm_logits": [B, L, V] ([B, P, V] `at_masked`) f32, "sequence_output":
    [B, L, H]}, the teacher's under "teacher_*"."""
    bert_encoder = encoder.BertEncoder(self.config, name="bert")
    optional = {k: batch[k] for k in _ENCODER_INPUTS if k in batch}
    out = bert_encoder(batch["input_ids"], batch["input_mask"], batch["segment_ids"], deterministic=deterministic,
                       pool=False, **optional)
    x = out["sequence_output"]
    projected = heads.gather_positions(x, batch["masked_lm_positions"]) if self.at_masked else x
    logits = heads.MaskedLMHead(self.config, name="mlm")(projected, bert_encoder.word_embeddings())
    if self.is_initializing() or not self.has_variable("frozen", "teacher"):
      # Init builds the student only; the teacher comes from outside (base.Frozen).
      teacher = {"mlm_logits": jnp.zeros_like(logits), "sequence_output": jnp.zeros_like(x)}
    else:
      teacher_params = self.get_variable("frozen", "teacher")
      teacher = TeacherMLM(self.teacher_config, self.at_masked, parent=None).apply({"params": teacher_params}, batch)
      teacher = jax.lax.stop_gradient(teacher)
    return {"mlm_logits": logits, "sequence_output": x, "teacher_mlm_logits": teacher["mlm_logits"],
            "teacher_sequence_output": teacher["sequence_output"]}


def build_model(config: ml_collections.ConfigDict):
  return DistilBertForPreTraining(base.encoder_config(config), teacher_config(config), soft_at_masked(config))


def loss_weights(batch: base.Batch, config=None) -> dict[str, jax.Array]:
  """Real tokens (cosine; soft targets) and masked tokens (MLM; soft targets `soft_at_masked`)."""
  tokens = jnp.sum(batch["input_mask"].astype(jnp.float32))
  masked = jnp.sum(batch["masked_lm_weights"].astype(jnp.float32))
  return {"soft": masked if soft_at_masked(config) else tokens, "mlm": masked, "cos": tokens}


def distill_sums(outputs: dict, batch: base.Batch, temp: float, at_masked: bool = False) -> dict[str, jax.Array]:
  """T^2 x soft cross-entropy (and T^2 x the teacher's entropy, for the KL) at real tokens (or the masked
  positions) and 1 - cos at real tokens; `soft_correct` counts where the student's argmax is the teacher's.
  f32 on purpose."""
  tokens = batch["input_mask"].astype(jnp.float32)
  weights = batch["masked_lm_weights"].astype(jnp.float32) if at_masked else tokens
  s_logp = jax.nn.log_softmax(outputs["mlm_logits"].astype(jnp.float32) / temp, axis=-1)
  t_logp = jax.nn.log_softmax(outputs["teacher_mlm_logits"].astype(jnp.float32) / temp, axis=-1)
  t_p = jnp.exp(t_logp)
  soft = -jnp.sum(t_p * s_logp, axis=-1) * temp ** 2
  entropy = -jnp.sum(t_p * t_logp, axis=-1) * temp ** 2
  agree = (jnp.argmax(s_logp, axis=-1) == jnp.argmax(t_logp, axis=-1)).astype(jnp.float32)
  s, t = (outputs[k].astype(jnp.float32) for k in ("sequence_output", "teacher_sequence_output"))
  # torch's CosineEmbeddingLoss (target 1): 1 - s.t / sqrt(|s|^2 |t|^2), with its eps on the product.
  cos = jnp.sum(s * t, -1) / jnp.sqrt(jnp.maximum(jnp.sum(s * s, -1) * jnp.sum(t * t, -1), 1e-12))
  return {"soft_loss_sum": jnp.sum(soft * weights), "soft_weight": jnp.sum(weights),
          "soft_correct": jnp.sum(agree * weights), "soft_teacher_entropy_sum": jnp.sum(entropy * weights),
          "cos_loss_sum": jnp.sum((1.0 - cos) * tokens), "cos_weight": jnp.sum(tokens)}


def loss_sums(outputs: dict, batch: base.Batch, config=None) -> dict[str, jax.Array]:
  """`soft_*`, `cos_*` at every real token and the student's `mlm_*` at the masked positions."""
  temp, at_masked = DEFAULT_TEMPERATURE if config is None else temperature(config), soft_at_masked(config)
  return {**bert.mlm_sums(outputs, batch, mlm_all_positions=not at_masked),
          **distill_sums(outputs, batch, temp, at_masked)}


def loss(sums: dict, weights: dict | None = None) -> jax.Array:
  return base.loss_from_sums(sums, LOSS_TERMS, weights)


def summarize(prefix: str, sums: dict) -> dict[str, float]:
  """Soft cross-entropy (`soft_accuracy`: the student's top token is the teacher's), its KL part
  (`distill_kl`), MLM loss/accuracy/perplexity and the cosine loss."""
  out = base.summarize_terms(prefix, sums, LOSS_TERMS, perplexity_terms=("mlm",))
  weight = float(sums.get("soft_weight", 0.0))
  if weight:
    out[f"{prefix}/distill_kl"] = (float(sums["soft_loss_sum"]) - float(sums["soft_teacher_entropy_sum"])) / weight
  return out


prediction_targets = bert.prediction_targets


def forward_flops_per_row(config: ml_collections.ConfigDict) -> dict[str, float]:
  """The student (MLM head at every position) and the teacher's forward, by component. The teacher takes
  no backward pass, so `train_flops_per_step`'s 3x overcounts it: its share is given as a third."""
  cfg, d = base.encoder_config(config), config.data
  positions = d.max_predictions_per_seq if soft_at_masked(config) else d.seq_length
  shapes = flops.Shapes(seq_length=d.seq_length, mlm_positions=positions, pooled_positions=0, use_nsp=False)
  student = flops.forward_flops_per_row(cfg, shapes)
  teacher = flops.forward_flops_per_row(teacher_config(config), shapes)
  return {**student, **{f"teacher_{k}": v / 3.0 for k, v in teacher.items()}}

"""One peer's BERT pretraining step, timed for `bert-jax bench train --compare`; a script, not a library.

    PYTHON bert_jax/tools/bench_peers.py hugging_face_flax   # or any other of PEERS

The peers may need package versions that conflict with ours, so `bench_compare` starts this file by its
path with any Python (`--peer_python`); it imports only the standard library and numpy at the top, never
`bert_jax` (`bert_jax/malloc.py`, standard library only, it loads by its path). Protocol, one JSON object per line:

  stdin  {"model": {...BertConfig fields}, "optimizer": {...}, "batch": "x.npz", "warmup": 2, "seed": 0,
          "dtype": bert_jax's compute dtype}
  stdout {"status": "ready", "versions": {...}, "differences": [...], "allocator": malloc}   (after warm-up)
         or {"status": "not installed", "reason": "..."} or {"status": "failed", "error": "..."}
  stdin  {"steps": n}   ->   stdout {"times": [seconds, ...], "loss": float}   (repeated until stdin closes)

Library output on stdout is moved to stderr so that stdout carries the protocol only.
"""

import functools
import importlib.util
import json
import os
import sys
import time
import traceback

import numpy as np

PEERS = ("hugging_face_flax", "hugging_face_flax_masked", "keras_hub", "hugging_face_torch")
# KerasHub's BERT GELU under bert_jax's `hidden_act` names (models/config.py; this script imports no bert_jax).
_TANH_GELUS = ("gelu_new", "gelu_pytorch_tanh")


class NotInstalled(Exception):
  """The peer's library is absent (or a version without the model): the peer is skipped."""


def _schedule_value(step, opt, ops):
  """bert_jax's schedule (google-research/bert): linear warmup from 0, then `lr * (1 - step / total)`."""
  peak, warmup, total = opt["learning_rate"], opt["warmup_steps"], opt["total_steps"]
  step = ops.cast(step, "float32") if hasattr(ops, "cast") else step.astype("float32")
  decayed = peak * ops.clip(1.0 - step / total, 0.0, 1.0)
  return ops.where(step < warmup, peak * step / max(warmup, 1), decayed) if warmup > 0 else decayed


def _mlm_labels(batch):
  """Hugging Face's layout: a label and a weight at every position, nonzero at the masked ones."""
  rows, length = batch["input_ids"].shape
  labels, weights = np.zeros((rows, length), np.int32), np.zeros((rows, length), np.float32)
  row = np.arange(rows)[:, None]
  labels[row, batch["masked_lm_positions"]] = batch["masked_lm_ids"]
  weights[row, batch["masked_lm_positions"]] = batch["masked_lm_weights"]
  return labels, weights


def _bfloat16(spec) -> bool:
  """Whether the peer computes in bfloat16 (mixed precision, float32 parameters, as bert_jax's `dtype`
  "bfloat16"); else it computes in float32."""
  return spec["dtype"] == "bfloat16"


def _precision(spec) -> list[str]:
  """The peers compute in bert_jax's dtype where it is float32 or bfloat16 (each in its own mixed precision),
  else in float32."""
  if spec["dtype"] in ("float32", "bfloat16"):
    return []
  return [f"float32 compute (bert_jax: {spec['dtype']})"]


def hugging_face_flax(spec, batch, masked: bool = False):
  """`FlaxBertForPreTraining` (MLM over every position, as the model computes it, plus NSP) with optax AdamW.

  `masked`: its encoder and heads applied as bert_jax applies its own, the MLM head on the masked
  positions' hidden states only (the same parameters; the work of bert_jax's step)."""
  transformers = _transformers_with_flax()
  import jax, jax.numpy as jnp, optax  # pylint: disable=g-import-not-at-top,multiple-imports
  config = _hugging_face_config(transformers, spec["model"])
  # `dtype`: the computation's (Hugging Face's Flax mixed precision); the parameters stay float32.
  model = transformers.FlaxBertForPreTraining(config, seed=spec["seed"],
                                              dtype=jnp.bfloat16 if _bfloat16(spec) else jnp.float32)
  tx = _flax_adamw(spec["optimizer"])
  # A label and a weight at every position, or at the masked ones alone ([rows, masked]).
  labels, weights = (batch["masked_lm_ids"], batch["masked_lm_weights"]) if masked else _mlm_labels(batch)
  inputs = jax.device_put((batch["input_ids"], batch["input_mask"], batch["segment_ids"], labels, weights,
                           batch["next_sentence_labels"], batch["masked_lm_positions"]))

  def loss_fn(params, rng, ids, mask, types, labels, weights, nsp_labels, masked_positions):
    if masked:
      mlm_logits, nsp_logits = model.module.apply({"params": params}, ids, mask, types, masked_positions, False,
                                                  method=_heads_at_masked, rngs={"dropout": rng})
    else:
      out = model(ids, mask, types, params=params, dropout_rng=rng, train=True)
      mlm_logits, nsp_logits = out.prediction_logits, out.seq_relationship_logits
    return _pretraining_loss(mlm_logits, nsp_logits, labels, weights, nsp_labels)

  @functools.partial(jax.jit, donate_argnums=(0, 1))   # as bert_jax's step
  def step(params, opt_state, rng, inputs):
    loss, grads = jax.value_and_grad(loss_fn)(params, rng, *inputs)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  state = [model.params, tx.init(model.params), jax.random.key(spec["seed"])]

  def run():
    params, opt_state, rng = state
    rng, dropout_rng = jax.random.split(rng)
    params, opt_state, loss = jax.block_until_ready(step(params, opt_state, dropout_rng, inputs))
    state[:] = params, opt_state, rng
    return loss

  versions = {"transformers": transformers.__version__, "jax": jax.__version__, "optax": optax.__version__}
  logits = (["MLM logits at the masked positions (the model's encoder and heads applied as bert_jax does)"]
            if masked else ["MLM logits at every position (the model's own head), loss read at the masked ones"])
  return run, versions, _precision(spec) + logits + [
      "optax.adamw: Adam with bias correction whatever bert_jax's optimizer.bias_correction"]


def _transformers_with_flax():
  """`transformers` where it and JAX's optax are installed and it has Flax models (before v5), else NotInstalled."""
  try:
    import transformers  # pylint: disable=g-import-not-at-top
    import jax, optax  # noqa: F401  pylint: disable=g-import-not-at-top,multiple-imports,unused-import
  except ImportError as e:
    raise NotInstalled(str(e)) from e
  if int(transformers.__version__.split(".")[0]) >= 5:
    raise NotInstalled(f"transformers {transformers.__version__} has no Flax models (transformers<5 has)")
  return transformers


def _flax_adamw(opt):
  """optax AdamW with bert_jax's schedule and clipping, and no decay on biases and LayerNorm parameters (as
  run_mlm_flax.py and bert_jax)."""
  import jax, jax.numpy as jnp, optax  # pylint: disable=g-import-not-at-top,multiple-imports
  decays = lambda path, _: not any("bias" in str(k) or "LayerNorm" in str(k) for k in path)  # noqa: E731
  return optax.chain(optax.clip_by_global_norm(opt["clip_norm"]),
                     optax.adamw(lambda s: _schedule_value(s, opt, jnp), opt["b1"], opt["b2"], opt["eps"],
                                 weight_decay=opt["weight_decay"],
                                 mask=lambda p: jax.tree_util.tree_map_with_path(decays, p)))


def _pretraining_loss(mlm_logits, nsp_logits, labels, weights, nsp_labels):
  """The MLM loss, a mean over the weighted labels, plus the NSP loss, a mean over the rows."""
  import jax, jax.numpy as jnp  # pylint: disable=g-import-not-at-top,multiple-imports
  logp = jax.nn.log_softmax(mlm_logits.astype(jnp.float32))
  mlm = -(jnp.take_along_axis(logp, labels[..., None], -1)[..., 0] * weights).sum() / weights.sum()
  nsp_logp = jax.nn.log_softmax(nsp_logits.astype(jnp.float32))
  return mlm - jnp.take_along_axis(nsp_logp, nsp_labels[:, None], -1).mean()


def _heads_at_masked(module, ids, mask, types, masked_positions, deterministic):
  """`FlaxBertForPreTrainingModule.__call__` with the MLM head on the masked positions alone."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  positions = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
  head_mask = jnp.ones((module.config.num_hidden_layers, module.config.num_attention_heads))
  hidden, pooled = module.bert(ids, mask, types, positions, head_mask, deterministic=deterministic,
                               return_dict=False)[:2]
  table = (module.bert.variables["params"]["embeddings"]["word_embeddings"]["embedding"]
           if module.config.tie_word_embeddings else None)
  hidden = jnp.take_along_axis(hidden, masked_positions[..., None], axis=1)
  return module.cls(hidden, pooled, shared_embedding=table)


def hugging_face_flax_masked(spec, batch):
  """`hugging_face_flax` with the MLM head on the masked positions only, as bert_jax's step computes it."""
  return hugging_face_flax(spec, batch, masked=True)


def keras_hub(spec, batch):
  """KerasHub `BertMaskedLM` (logits at the masked positions, no NSP head), Keras AdamW, JAX backend."""
  os.environ["KERAS_BACKEND"] = "jax"   # before Keras is imported
  try:
    import keras  # pylint: disable=g-import-not-at-top
    import keras_hub as kh  # pylint: disable=g-import-not-at-top
    import jax  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise NotInstalled(str(e)) from e
  m, opt = spec["model"], spec["optimizer"]
  keras.utils.set_random_seed(spec["seed"])
  # Keras' mixed precision: float32 variables, bfloat16 compute.
  keras.config.set_dtype_policy("mixed_bfloat16" if _bfloat16(spec) else "float32")
  backbone = kh.models.BertBackbone(
      vocabulary_size=m["vocab_size"], num_layers=m["num_layers"], num_heads=m["num_heads"],
      hidden_dim=m["hidden_size"], intermediate_dim=m["intermediate_size"], dropout=m["hidden_dropout"],
      max_sequence_length=m["max_position_embeddings"], num_segments=m["type_vocab_size"])
  model = kh.models.BertMaskedLM(backbone=backbone, preprocessor=None)

  class Schedule(keras.optimizers.schedules.LearningRateSchedule):
    def __call__(self, step):
      return _schedule_value(step, opt, keras.ops)

  optimizer = keras.optimizers.AdamW(Schedule(), weight_decay=opt["weight_decay"], beta_1=opt["b1"],
                                     beta_2=opt["b2"], epsilon=opt["eps"], global_clipnorm=opt["clip_norm"])
  optimizer.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])   # biases and LayerNorm
  model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  x = {"token_ids": batch["input_ids"], "segment_ids": batch["segment_ids"],
       "padding_mask": batch["input_mask"].astype(bool), "mask_positions": batch["masked_lm_positions"]}
  x, y, w = jax.device_put((x, batch["masked_lm_ids"], batch["masked_lm_weights"]))

  def run():
    # The loss comes back as a host float: the step has finished.
    return model.train_on_batch(x, y, sample_weight=w, return_dict=True)["loss"]

  versions = {"keras_hub": kh.__version__, "keras": keras.__version__, "jax": jax.__version__}
  # BertBackbone's layers take the tanh GELU; BertMaskedLM's head transform Keras' exact "gelu".
  gelu = (f"the MLM head's transform with the exact GELU (bert_jax: {m['hidden_act']})"
          if m["hidden_act"] in _TANH_GELUS else f"tanh-approximated GELU in the layers (bert_jax: {m['hidden_act']})")
  differences = _precision(spec) + ["no NSP head or loss (BertMaskedLM is MLM only)", gelu,
                 "one dropout rate for hidden and attention",
                 "Keras AdamW: epsilon added to sqrt(v) before bias correction; bias correction always on"]
  return run, versions, differences


def _hugging_face_config(transformers, m):
  return transformers.BertConfig(
      vocab_size=m["vocab_size"], hidden_size=m["hidden_size"], num_hidden_layers=m["num_layers"],
      num_attention_heads=m["num_heads"], intermediate_size=m["intermediate_size"], hidden_act=m["hidden_act"],
      hidden_dropout_prob=m["hidden_dropout"], attention_probs_dropout_prob=m["attention_dropout"],
      max_position_embeddings=m["max_position_embeddings"], type_vocab_size=m["type_vocab_size"],
      initializer_range=m["initializer_range"], layer_norm_eps=m["layer_norm_eps"])


def hugging_face_torch(spec, batch):
  """PyTorch `BertForPreTraining` (its own MLM + NSP loss) with torch AdamW, on CUDA when there is one."""
  try:
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise NotInstalled(str(e)) from e
  opt = spec["optimizer"]
  torch.manual_seed(spec["seed"])
  device = "cuda" if torch.cuda.is_available() else "cpu"
  model = transformers.BertForPreTraining(_hugging_face_config(transformers, spec["model"])).to(device).train()
  no_decay = lambda n: "bias" in n or "LayerNorm" in n  # noqa: E731  biases and LayerNorm, as bert_jax
  named = list(model.named_parameters())
  groups = [{"params": [p for n, p in named if not no_decay(n)], "weight_decay": opt["weight_decay"]},
            {"params": [p for n, p in named if no_decay(n)], "weight_decay": 0.0}]
  optimizer = torch.optim.AdamW(groups, lr=opt["learning_rate"], betas=(opt["b1"], opt["b2"]), eps=opt["eps"])
  schedule = torch.optim.lr_scheduler.LambdaLR(
      optimizer, lambda s: float(_schedule_value(np.asarray(s), opt, np)) / opt["learning_rate"])
  labels, weights = _mlm_labels(batch)
  labels[weights == 0] = -100   # the positions the loss ignores
  inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["input_mask"],
            "token_type_ids": batch["segment_ids"], "labels": labels,
            "next_sentence_label": batch["next_sentence_labels"]}
  inputs = {k: torch.as_tensor(np.asarray(v, np.int64), device=device) for k, v in inputs.items()}

  def run():
    with torch.autocast(device, dtype=torch.bfloat16, enabled=_bfloat16(spec)):   # PyTorch's mixed precision
      loss = model(**inputs).loss
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), opt["clip_norm"])
    optimizer.step()
    schedule.step()
    return loss.item()   # waits for the device

  versions = {"transformers": transformers.__version__, "torch": torch.__version__, "device": device}
  differences = _precision(spec) + ["MLM logits at every position (the model's own head), eager PyTorch"]
  return run, versions, differences


def _allocator() -> str:
  """The malloc this process runs with, by `bert_jax/malloc.py` (loaded by its path: this file runs in the
  peers' environment, which need not have bert_jax)."""
  path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "malloc.py")
  spec = importlib.util.spec_from_file_location("bert_jax_malloc", path)
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
    return module.in_use()
  except Exception as e:  # pylint: disable=broad-except  (the peers' Python may be older than ours)
    return f"unknown ({type(e).__name__}: {e})"


def main(argv) -> None:
  protocol = os.fdopen(os.dup(1), "w", buffering=1)
  os.dup2(2, 1)   # anything a library prints goes to stderr
  sys.stdout = sys.stderr

  def send(**message):
    protocol.write(json.dumps(message) + "\n")

  name = argv[1] if len(argv) > 1 else ""
  if name not in PEERS:
    send(status="failed", error=f"unknown peer {name!r}; one of {PEERS}")
    return
  spec = json.loads(sys.stdin.readline())
  try:
    with np.load(spec["batch"]) as f:
      batch = dict(f)
    run, versions, differences = globals()[name](spec, batch)
    for _ in range(spec["warmup"]):   # compilation
      run()
  except NotInstalled as e:
    send(status="not installed", reason=str(e))
    return
  except Exception:  # pylint: disable=broad-except
    send(status="failed", error=traceback.format_exc(limit=4))
    return
  send(status="ready", versions=versions, differences=differences, allocator=_allocator())
  for line in sys.stdin:
    times, loss = [], None
    for _ in range(json.loads(line)["steps"]):
      start = time.perf_counter()
      loss = run()
      times.append(time.perf_counter() - start)
    send(times=times, loss=float(np.asarray(loss)))


if __name__ == "__main__":
  main(sys.argv)

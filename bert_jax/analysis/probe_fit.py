"""The probing classifiers of `bert-jax analyze probe` (bert_jax/analysis/probe.py): one per layer, and the
scalar-mix probe of Tenney et al. 2019, trained on frozen features with early stopping on the dev loss.

A probe is a softmax classifier (`Probe`; with a ReLU hidden layer when `hidden` > 0) trained with Adam and
decoupled weight decay on its kernels; one training run fits every layer (vmap over the layer axis).
`MixProbe` feeds the same classifier a softmax-weighted mix of all layers (`finetune.scalar_mix.ScalarMix`),
whose mix logits learn `mix_rate` times faster.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bert_jax.finetune import scalar_mix


class Probe(nn.Module):
  """A softmax classifier of one representation [B, H]: linear, or with a ReLU hidden layer (`hidden` > 0)."""
  num_classes: int
  hidden: int = 0

  @nn.compact
  def __call__(self, x_BH):
    if self.hidden:
      x_BH = nn.relu(nn.Dense(self.hidden, name="hidden")(x_BH))
    return nn.Dense(self.num_classes, name="output")(x_BH)


class MixProbe(nn.Module):
  """Tenney et al. 2019's probe: a scalar mix of every representation [N, B, H], then `Probe`."""
  num_classes: int
  hidden: int = 0

  @nn.compact
  def __call__(self, x_NBH):
    return Probe(self.num_classes, self.hidden, name="probe")(scalar_mix.ScalarMix(name="scalar_mix")(x_NBH))


def standardise(x: dict) -> dict:
  """Each split's [N, n, H] features, less train's per-layer mean, over train's per-layer std."""
  mean = x["train"].mean(1, keepdims=True)
  std = x["train"].std(1, keepdims=True) + 1e-6
  return {split: (v - mean) / std for split, v in x.items()}


def fit(module: nn.Module, x: dict, y: dict, *, shared: bool, learning_rate: float = 3e-3,
        weight_decay: float = 1e-2, batch_size: int = 128, max_epochs: int = 100, patience: int = 8,
        seed: int = 0, mix_rate: float = 10.0):
  """Trains one probe per layer (`shared` False: head l reads x[l]) or one reading all layers (True).

  Args:
    x: {"train", "dev", ...}: [N, n, H] features; y: the same splits' labels, int [n].
  Returns:
    (params with a leading head axis, each head's at its best dev loss; apply(params, x_NBH) -> [heads, B, C]).
  """
  in_axes = (0, None) if shared else (0, 0)
  apply = jax.vmap(module.apply, in_axes=in_axes)
  heads = 1 if shared else x["train"].shape[0]
  params = init_params(module, x["train"][:, :1] if shared else x["train"][0, :1], heads, seed)
  tx = _optimizer(learning_rate, weight_decay, mix_rate)
  n = len(y["train"])
  size = min(batch_size, n)
  losses = functools.partial(_losses, apply)

  def epoch(x_train, y_train, x_dev, y_dev, carry):
    e, since, p, opt, best, best_loss, key = carry
    key, sub = jax.random.split(key)
    order = jax.random.permutation(sub, n)[:n // size * size].reshape(-1, size)

    def step(state, idx):
      p, opt = state
      grads = jax.grad(lambda q: losses(q, x_train[:, idx], y_train[idx]).sum())(p)
      updates, opt = tx.update(grads, opt, p)
      return (optax.apply_updates(p, updates), opt), None

    (p, opt), _ = jax.lax.scan(step, (p, opt), order)
    loss = losses(p, x_dev, y_dev)
    better = loss < best_loss
    best = jax.tree_util.tree_map(lambda b, q: jnp.where(better.reshape((-1,) + (1,) * (q.ndim - 1)), q, b), best, p)
    return e + 1, jnp.where(better.any(), 0, since + 1), p, opt, best, jnp.minimum(loss, best_loss), key

  @jax.jit
  def train(p, x_train, y_train, x_dev, y_dev, key):
    carry = (0, 0, p, tx.init(p), p, jnp.full([heads], jnp.inf), key)
    carry = jax.lax.while_loop(lambda c: (c[0] < max_epochs) & (c[1] < patience),
                               functools.partial(epoch, x_train, y_train, x_dev, y_dev), carry)
    return carry[4]

  best = train(params, x["train"], y["train"], x["dev"], y["dev"], jax.random.key(seed + 1))
  return best, apply


def _optimizer(learning_rate: float, weight_decay: float, mix_rate: float):
  """AdamW on the kernels, Adam on the biases and, at `mix_rate` times the rate, on the scalar mix."""
  return optax.multi_transform(
      {"kernel": optax.adamw(learning_rate, weight_decay=weight_decay), "other": optax.adam(learning_rate),
       "mix": optax.adam(learning_rate * mix_rate)},
      lambda p: jax.tree_util.tree_map_with_path(lambda path, _: _param_group(path), p))


def _losses(apply, p, xs, ys):
  """[heads] mean cross-entropy over the labels train has (-1: a label it lacks)."""
  logits = apply(p, xs)
  known = ys >= 0
  targets = jnp.broadcast_to(jnp.maximum(ys, 0), logits.shape[:-1])
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
  return (ce * known).sum(-1) / jnp.maximum(known.sum(), 1)


def init_params(module: nn.Module, x, heads: int, seed: int):
  """`heads` draws of the module's params, stacked: kernels N(0, 1/fan_in), biases and mix logits 0, the mix
  scale 1 (ScalarMix's own start). Drawn with numpy: compiling JAX's random initialisers takes seconds on CPU."""
  rng = np.random.default_rng(seed)

  def draw(path, leaf):
    name = path[-1].key
    if name == "kernel":
      return (rng.standard_normal((heads,) + leaf.shape) / np.sqrt(leaf.shape[0])).astype(np.float32)
    return np.full((heads,) + leaf.shape, 1.0 if name == "scale" else 0.0, np.float32)

  return jax.tree_util.tree_map_with_path(draw, jax.eval_shape(module.init, jax.random.key(0), x))


def _param_group(path) -> str:
  """Weight decay on kernels only; the scalar mix learns `mix_rate` times faster (see `fit`)."""
  names = [k.key for k in path]
  return "mix" if "scalar_mix" in names else "kernel" if names[-1] == "kernel" else "other"


def accuracies(params, apply, x: dict, y: dict) -> dict:
  """{split: [heads] accuracy} as numpy."""
  run = jax.jit(lambda p, xs, ys: (apply(p, xs).argmax(-1) == ys).mean(-1))
  return {split: np.asarray(run(params, x[split], y[split])) for split in x}


def probe_task(x: dict, labels: dict, *, hidden: int = 0, **train_opts) -> dict:
  """Layer-wise and scalar-mix probes on one task's features; see `fit` for `train_opts`.

  Returns:
    {"layers": {split: [N] accuracy}, "mix": {split: accuracy}, "mix_weights": [N], "mix_gamma",
     "expected_layer", "majority_baseline", "num_classes"}.
  """
  names = sorted(set(labels["train"]))
  index = {name: i for i, name in enumerate(names)}
  y = {s: np.array([index.get(v, -1) for v in values], np.int32) for s, values in labels.items()}  # -1: unseen
  x = standardise(x)
  per_layer, apply = fit(Probe(len(names), hidden), x, y, shared=False, **train_opts)
  mix, mix_apply = fit(MixProbe(len(names), hidden), x, y, shared=True, **train_opts)
  mixed = jax.device_get(mix["params"]["scalar_mix"])
  weights = np.asarray(jax.nn.softmax(mixed["weights"][0]))
  majority = index[max(names, key=labels["train"].count)]
  return {"layers": accuracies(per_layer, apply, x, y),
          "mix": {s: float(a[0]) for s, a in accuracies(mix, mix_apply, x, y).items()},
          "mix_weights": weights.tolist(), "mix_gamma": float(mixed["scale"][0]),
          "expected_layer": float((np.arange(len(weights)) * weights).sum()),
          "majority_baseline": float((y["test"] == majority).mean()), "num_classes": len(names)}

"""The encoder's params in either layer layout: scanned (`model.scan_layers`), every layer's leaves stacked
under `layers` [N, ...]; unrolled, one by one under `layer_0..layer_{N-1}`. Trees laid out like the params
(an optimizer's moments, abstract shapes, a checkpoint's metadata) follow the same rule."""

import re
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

SCANNED, UNROLLED = "scanned", "unrolled"
_LAYER = re.compile(r"layer_\d+")


def _map_layer_dicts(tree, fn):
  """`fn` applied to every dict in `tree`, outermost first, through any pytree containers around them (an
  optimizer state's tuples around its moments)."""
  if isinstance(tree, dict):
    tree = fn(tree)
    return {k: _map_layer_dicts(v, fn) for k, v in tree.items()}
  if tree is None or jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(tree)):
    return tree
  return jax.tree.map(lambda x: _map_layer_dicts(x, fn), tree, is_leaf=lambda x: isinstance(x, dict))


def _stack(*xs):
  return np.stack(xs) if isinstance(xs[0], np.ndarray) else jnp.stack(xs)


def scan_params(params, stack=_stack, fill=np.ones_like):
  """Unscanned -> scanned layout: every `layer_0..layer_{N-1}` group becomes `layers` [N, ...].

  `stack` joins the N layers' leaves and `fill` makes a leaf layer 0 lacks (pre_norm's attention norm) from
  layer 1's; other trees laid out like the params (optimizer moments, abstract shapes) pass their own."""
  def group(d):
    n = sum(1 for k in d if _LAYER.fullmatch(k))
    if not n:
      return d
    layers = [d[f"layer_{i}"] for i in range(n)]
    if n > 1 and set(layers[0]) < set(layers[1]):
      # pre_norm: layer 0 has no attention norm; scanned, its step holds an unused one (ones, as initialised).
      missing = {k: v for k, v in layers[1].items() if k not in layers[0]}
      layers[0] = {**jax.tree.map(fill, missing), **layers[0]}
    rest = {k: v for k, v in d.items() if not _LAYER.fullmatch(k)}
    return {**rest, "layers": jax.tree.map(stack, *layers)}
  return _map_layer_dicts(params, group)


def unscan_params(params, index=lambda x, i: x[i]):
  """Scanned -> unscanned layout (inverse of `scan_params`); `index(leaf, i)` takes layer i of a leaf."""
  def split(d):
    if "layers" not in d:
      return d
    n = jax.tree.leaves(d["layers"])[0].shape[0]
    rest = {k: v for k, v in d.items() if k != "layers"}
    return {**rest, **{f"layer_{i}": jax.tree.map(lambda x: index(x, i), d["layers"]) for i in range(n)}}
  return _map_layer_dicts(params, split)


def layer_layout(tree: Any) -> str | None:
  """SCANNED or UNROLLED for the first dict in `tree` that holds encoder layers; None if none does."""
  for d in jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, Mapping)):
    if isinstance(d, Mapping) and (found := _dict_layout(d)):
      return found
  return None


def _dict_layout(d: Mapping) -> str | None:
  if "layers" in d:
    return SCANNED
  if any(_LAYER.fullmatch(str(k)) for k in d):
    return UNROLLED
  return next((found for v in d.values() if isinstance(v, Mapping) and (found := _dict_layout(v))), None)


def uneven_layers(tree: Any) -> bool:
  """Whether an unrolled stack in `tree` has layers with different params (pre_norm's layer 0)."""
  def paths(t):
    return {jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(t)[0]}

  def uneven(d):
    if not isinstance(d, Mapping):
      return False
    if "layer_0" in d and "layer_1" in d:
      return paths(d["layer_0"]) != paths(d["layer_1"])
    return any(uneven(v) for v in d.values())
  return any(uneven(d) for d in jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, Mapping)))

"""Attention heads removed from the weights (Michel et al. 2019, "Are Sixteen Heads Really Better than One?").

  cfg, params = pruning.prune_heads(cfg, params, {0: [1, 5], 3: [2]})

The result computes what the unpruned model computes with those heads' `head_mask` entries at 0, with
smaller query/key/value/output projections. `cfg.pruned_heads` records what was removed, in the original
head numbering (as transformers' config `pruned_heads`, which it writes), so pruning twice composes.
"""

import dataclasses

import numpy as np

from bert_jax.models.config import BertConfig


def prune_heads(cfg: BertConfig, params: dict, heads: dict) -> tuple[BertConfig, dict]:
  """(config, params) with `heads` ({layer: [head, ...]}, original numbering) removed.

  `params`: a model's params holding the encoder under "bert" (a finetuned or pretraining model), or the
  encoder's own (with "encoder" at the top), unscanned. Other subtrees (heads) are kept as they are.
  """
  if not prunable(cfg):
    raise ValueError("pruning needs per-layer attention weights: not with share_layers, scan_layers or "
                     "shared_sublayer 'attention'")
  new_cfg = dataclasses.replace(cfg, pruned_heads=dict(cfg.pruned_heads) | {
      int(layer): tuple(set(dict(cfg.pruned_heads).get(int(layer), ())) | {int(h) for h in hs})
      for layer, hs in heads.items()})
  # Positions, in each layer's current weights, of the heads it keeps.
  keep = {i: [cfg.kept_heads(i).index(h) for h in new_cfg.kept_heads(i)] for i in range(cfg.num_layers)}
  return new_cfg, _with_attention(params, {i: lambda a, k=k: _prune_attention(a, k) for i, k in keep.items()})


def prunable(cfg: BertConfig) -> bool:
  """Whether `cfg`'s heads can be taken out of the weights: each layer has its own attention weights."""
  return not (cfg.share_layers or cfg.scan_layers or cfg.shared_sublayer == "attention")


def _with_attention(params: dict, edits: dict) -> dict:
  """`params` (a model's, the encoder under "bert", or the encoder's own) with `edits[i]` applied to layer i's
  attention params."""
  encoder_params = params["bert"] if "bert" in params else params
  layers = dict(encoder_params["encoder"])
  for i, edit in edits.items():
    layers[f"layer_{i}"] = {**layers[f"layer_{i}"], "attention": edit(dict(layers[f"layer_{i}"]["attention"]))}
  encoder_params = {**encoder_params, "encoder": layers}
  return {**params, "bert": encoder_params} if "bert" in params else encoder_params


def _prune_attention(attention: dict, keep: list) -> dict:
  take = lambda x, axis: np.take(np.asarray(x), keep, axis=axis)
  for name in ("query", "key", "value"):
    proj = dict(attention[name])
    proj["kernel"] = take(proj["kernel"], 1)   # [H, N, K]
    if "bias" in proj:
      proj["bias"] = take(proj["bias"], 0)     # [N, K]
    attention[name] = proj
  attention["out"] = {**attention["out"], "kernel": take(attention["out"]["kernel"], 0)}  # [N, K, H]
  return attention


def silence_heads(cfg: BertConfig, params: dict, heads: dict) -> dict:
  """`params` with the output projection of `heads` ({layer: head}, original numbering, kept heads) at zero:
  the layer computes what it computes without them. A layer whose every head goes keeps one so silenced
  (`analyze prune`'s export: a checkpoint cannot hold the empty arrays of a layer with no heads)."""

  def silence(attention, position):
    kernel = np.array(attention["out"]["kernel"])   # [N, K, H]
    kernel[position] = 0
    return {**attention, "out": {**attention["out"], "kernel": kernel}}

  return _with_attention(params, {layer: lambda a, p=cfg.kept_heads(layer).index(head): silence(a, p)
                                  for layer, head in heads.items()})

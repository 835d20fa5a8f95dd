"""`bert-jax bench train --compare`: our train step against the installed peers, same run, alternating.

Each peer (`bench_peers.PEERS`) runs in a child process started with `--peer_python` (default: this
interpreter), so its packages may live in another virtual environment. Every system builds the same
model (our config's sizes, f32 for the peers; PyTorch on CUDA when it sees a GPU), trains on the same
batch (written once to an .npz file) with AdamW at our learning-rate schedule, compiles during its
warm-up steps, and then the systems take turns, one timed step each a round, each round starting one
system later than the one before. The result holds each system's median step time and tokens/s and the
ratios of medians, each with a 90% interval from the rounds resampled (`ratio_interval`); a peer that is not installed is reported so and skipped. The peers inherit our
environment, so they run with the malloc `malloc.reexec` gave us; each system reports its own.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Callable

import numpy as np

from bert_jax import malloc
from bert_jax.tools import bench_peers

OURS = "bert_jax"
_RUNNER = bench_peers.__file__


class Peer:
  """A peer's child process: started, warmed up and ready to time steps on request."""

  def __init__(self, name: str, python: str, spec: dict, log_dir: str):
    self.name, self.status, self.info = name, "failed", {}
    self._log = open(os.path.join(log_dir, f"{name}.log"), "w+")   # the child's stderr, shown on failure
    try:
      self._proc = subprocess.Popen([python, _RUNNER, name], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=self._log, text=True, bufsize=1)
    except OSError as e:   # no such interpreter
      self._proc, self.status, self.info = None, "not installed", {"reason": f"{python}: {e.strerror}"}
      return
    try:
      reply = self._request(spec)
    except Exception:   # a broken pipe or an unreadable reply: stop the child before passing it on
      self._proc.kill()
      self._proc.wait(timeout=60)
      self._log.close()
      raise
    self.status = reply.pop("status", "failed")
    self.info = reply

  def _request(self, message: dict) -> dict:
    self._proc.stdin.write(json.dumps(message) + "\n")
    self._proc.stdin.flush()
    line = self._proc.stdout.readline()
    if not line:   # the child died: its stderr says why
      self._log.seek(0)
      return {"status": "failed", "error": self._log.read()[-2000:]}
    return json.loads(line)

  def step(self) -> float:
    """Seconds of one timed step in the child."""
    reply = self._request({"steps": 1})
    if "times" not in reply:
      raise RuntimeError(f"peer {self.name} failed: {reply.get('error')}")
    if not np.isfinite(reply["loss"]):
      raise FloatingPointError(f"peer {self.name}'s step produced a non-finite loss")
    return reply["times"][0]

  def close(self) -> None:
    if self._proc is not None:
      self._proc.stdin.close()
      self._proc.wait(timeout=60)
    self._log.close()


def alternate(steps: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
  """`rounds` rounds of one timed step per system; each system's seconds. Each round starts one system
  later than the one before (a, b, c; b, c, a; ...), so that no system always follows the same one."""
  times, names = {name: [] for name in steps}, list(steps)
  for r in range(rounds):
    for name in names[r % len(names):] + names[:r % len(names)]:
      times[name].append(steps[name]())
  return times


def summarize(times: dict[str, list[float]], tokens_per_step: int, ours: str = OURS) -> dict:
  """Per system the median step and tokens/s; `ours / peer` ratios of median tokens/s (> 1: ours is faster),
  each with `ratio_interval`'s 90% interval."""
  systems = {name: {"step_seconds": t, "step_seconds_median": statistics.median(t),
                    "tokens_per_second_median": tokens_per_step / statistics.median(t)}
             for name, t in times.items()}
  ratios = {f"{ours}/{name}": s["step_seconds_median"] / systems[ours]["step_seconds_median"]
            for name, s in systems.items() if name != ours}
  intervals = {f"{ours}/{name}": ratio_interval(times[ours], t) for name, t in times.items() if name != ours}
  return {"systems": systems, "tokens_per_second_ratio": ratios, "tokens_per_second_ratio_interval": intervals}


def ratio_interval(ours: list[float], peer: list[float], level: float = 0.9, resamples: int = 2000,
                   seed: int = 0) -> list[float] | None:
  """A bootstrap interval (`level`, percentiles) of median(peer) / median(ours), the rounds resampled with
  their steps paired: round r's step of each system is drawn together, so what moved both (the machine's
  load that minute) moves the ratio less than it moves either. None where the two step lists differ in
  length (no pairs to draw)."""
  if len(ours) != len(peer) or not ours:
    return None
  ours, peer = np.asarray(ours), np.asarray(peer)
  rounds = np.random.default_rng(seed).integers(0, len(ours), size=(resamples, len(ours)))
  ratios = np.median(peer[rounds], axis=1) / np.median(ours[rounds], axis=1)
  low, high = np.quantile(ratios, [(1 - level) / 2, (1 + level) / 2])
  return [float(low), float(high)]


def peer_spec(config, batch_path: str, warmup: int) -> dict:
  """What a peer needs to build our model and optimizer (`bench_peers` protocol)."""
  from bert_jax import train  # pylint: disable=g-import-not-at-top
  if config.get("objective", "bert") != "bert" or config.data.format != "nsp" or config.data.packing:
    raise ValueError("--compare runs BERT's MLM + NSP on unpacked rows: objective 'bert', data.format 'nsp', "
                     "data.packing False")
  cfg = train.bert_config(config)
  fields = ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size", "max_position_embeddings",
            "type_vocab_size", "hidden_act", "hidden_dropout", "attention_dropout", "initializer_range",
            "layer_norm_eps")
  opt = config.optimizer
  if opt.name != "adamw":
    raise ValueError(f"the peers train with AdamW; optimizer.name is {opt.name!r}")
  if opt.get("schedule", "linear") != "linear":
    raise ValueError(f"the peers take BERT's linear schedule; optimizer.schedule is {opt.schedule!r}")
  if config.get("mlm_all_positions", False):
    raise ValueError("the peers compute the MLM loss at the masked positions (`bench_peers`): mlm_all_positions "
                     "must be False")
  return {"model": {f: getattr(cfg, f) for f in fields},
          "optimizer": {f: float(opt[f]) for f in ("learning_rate", "b1", "b2", "eps", "weight_decay", "clip_norm")}
          | {"warmup_steps": int(opt.warmup_steps), "total_steps": int(opt.total_steps)},
          "batch": batch_path, "warmup": warmup, "seed": int(config.seed), "dtype": str(np.dtype(cfg.dtype))}


def compare(config, batch: dict[str, np.ndarray], ours_step: Callable[[], float], steps: int,
            peer_python: str = sys.executable, warmup: int = 2) -> dict:
  """`steps` alternating rounds of our step (`ours_step`, warmed up, on `batch`) and each installed peer's.

  Returns `summarize`'s dict with each peer's status ("measured", "not installed: ...", "failed: ...")
  and, for measured peers, its versions and what differs from our step.
  """
  tokens = config.global_batch_size * config.data.seq_length
  with tempfile.TemporaryDirectory() as tmp:
    batch_path = os.path.join(tmp, "batch.npz")
    np.savez(batch_path, **batch)
    spec = peer_spec(config, batch_path, warmup)
    peers = []
    try:
      for name in bench_peers.PEERS:   # each started inside the try: a failure closes those already running
        peers.append(Peer(name, peer_python, spec, tmp))
      ready = {p.name: p.step for p in peers if p.status == "ready"}
      times = alternate({OURS: ours_step} | ready, steps)
    finally:
      for p in peers:
        p.close()
  result = summarize(times, tokens)
  for p in peers:
    entry = result["systems"].setdefault(p.name, {})
    why = p.info.get("reason") or p.info.get("error")
    entry["status"] = "measured" if p.status == "ready" else f"{p.status}: {why}"
    entry.update({k: v for k, v in p.info.items() if k in ("versions", "differences", "allocator")})
  result["systems"][OURS] |= {"status": "measured", "allocator": malloc.in_use()}
  result["peer_python"] = peer_python
  return result

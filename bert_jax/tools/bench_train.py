"""`bert-jax bench train`: step time, tokens/s and MFU of the real train step on this machine; JSON.

    bert-jax bench train                                  # the comparison config below
    bert-jax bench train --config=configs/tiny.py --steps=20
    bert-jax bench train --compare --peer_python=PATH     # and the installed peers, same run (bench_compare.py)
    bert-jax bench train --compare --dropout_bits=hash    # our dropouts with the counter hash (models/dropout.py)
    bert-jax bench train --compare --dropout_bits=hash --dropout_rng=hash   # and its keys (models/dropout_key.py)

Without `--config` the model is the one of a common CPU comparison: L=4 H=256 A=4 I=1024, vocab
30522, seq 128 (20 predictions), batch 16, AdamW, BERT's tanh GELU, computing in float32, or with `--dtype=bfloat16`
in bfloat16 (on a CPU with AMX, XLA:CPU's bfloat16 matmuls run at about five times its float32 ones; the peers
compute in the same dtype, docs/performance.md). `--compare` times Hugging Face's `BertForPreTraining`
(Flax and PyTorch) and KerasHub's `BertMaskedLM` on that model and batch in the same run, alternating
steps with ours, and prints the ratios of the medians; a peer that is not installed is reported so.
No figure here comes from another machine.

MFU is the analytic model FLOPs (the objective's, `flops.py`) per second over a peak measured here, the best of a
few large matmuls in the step's dtype, sampled right after each of our timed steps: each step is set against the
machine as it was then (its speed drifts within minutes here), and the median is of those per-step shares.
Batches are synthetic (random ids, 15% masked, packed rows when `data.packing`), built before timing, so the
input pipeline is not measured (`bert-jax bench data`).
"""

import functools
import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import flags
from ml_collections import config_flags

from bert_jax import config_loading
from bert_jax import malloc
from bert_jax import objectives
from bert_jax import run_checks
from bert_jax import sharding
from bert_jax import train
from bert_jax import train_setup
from bert_jax.models import dropout
from bert_jax.objectives import base
from bert_jax.tools import bench_compare

from bert_jax import config_path

config_path.put_config_root_on_path(sys.argv)   # config files do `from configs import common`


def comparison_config(packing: bool = True, dtype: str = "float32") -> ml_collections.ConfigDict:
  """L=4 H=256 A=4 I=1024 ("mini"), vocab 30522, seq 128 (20 predictions), batch 16, AdamW, float32
  compute (or `dtype`: the peers take the same), BERT's tanh GELU; packed rows unless `packing=False`
  (`--compare`: the peers take one example per row). In bfloat16 on a CPU the matmuls take the forms of
  XLA:CPU's matrix library (`model.matmuls` "library", models/library_matmul.py)."""
  config_path.put_shipped_configs_first()
  from configs import common  # pylint: disable=g-import-not-at-top
  c = common.pretrain_config()
  c.model.preset = "mini"
  c.model.vocab_size = 30522
  c.model.max_position_embeddings = 512
  c.data.seq_length, c.data.max_predictions_per_seq = 128, 20
  c.data.packing = packing
  c.global_batch_size = 16
  c.optimizer.name = "adamw"
  c.dtype = dtype
  if dtype == "bfloat16" and jax.default_backend() == "cpu":
    c.model.matmuls = "library"
  # BERT's own GELU, google-research/bert's tanh approximation (the paper configs'): KerasHub's `BertBackbone`
  # has it too, and the peers' spec hands it to Hugging Face's models ("gelu_new").
  c.model.hidden_act = "gelu_new"
  return c


class MatmulPeak:
  """This machine's practical peak: [n, n] x [n, n] matmuls, compiled once; a call gives the FLOP/s of the
  best of `repeats` of them. `benchmark` takes them in the step's compute dtype, 2048 wide on a CPU and 8192
  on an accelerator, whose matrix units a 2048-wide product leaves partly idle. The product is accumulated
  and written in float32, the form every backend's matrix units run fastest: XLA:CPU runs a bfloat16
  product with a bfloat16 result on float32 kernels, with a float32 one on its AMX units at about five times
  that (models/library_matmul.py)."""

  def __init__(self, n: int = 2048, dtype=jnp.float32, repeats: int = 3):
    self._a = jax.random.normal(jax.random.key(0), (n, n), dtype)
    self._b = jax.random.normal(jax.random.key(1), (n, n), dtype)
    self._matmul = jax.jit(functools.partial(jnp.matmul, preferred_element_type=jnp.float32))
    self._matmul(self._a, self._b).block_until_ready()
    self._flops, self._repeats = 2 * n**3, repeats

  def __call__(self) -> float:
    best = float("inf")
    for _ in range(self._repeats):
      start = time.perf_counter()
      self._matmul(self._a, self._b).block_until_ready()
      best = min(best, time.perf_counter() - start)
    return self._flops / best


def mfu_figures(step_flops: float, times: list[float], peaks: list[float]) -> dict:
  """MFU from step times and the matmul peak sampled beside each step (`peaks[i]` right after `times[i]`).

  "mfu_median" is the median over steps of each step's FLOP/s over its own peak sample, "mfu" that share at
  the best step; "mfu_median_against_best_peak" sets the median step against the run's best sample, the
  most conservative reading.
  """
  if len(times) != len(peaks) or not times:
    raise ValueError(f"one peak sample per step: {len(times)} steps, {len(peaks)} samples")
  shares = [step_flops / t / p for t, p in zip(times, peaks)]
  best = min(range(len(times)), key=times.__getitem__)
  return {"matmul_peak_flops": statistics.median(peaks), "matmul_peak_flops_best": max(peaks),
          "mfu": shares[best], "mfu_median": statistics.median(shares),
          "mfu_median_against_best_peak": step_flops / statistics.median(times) / max(peaks)}


def synthetic_batch(config: ml_collections.ConfigDict, seed: int = 0) -> dict[str, np.ndarray]:
  """One global batch of the objective's schema: the input pipeline's keys, shapes and dtypes.

  Every token is real; with `data.packing` each row holds `max_examples_per_row` equal examples, each
  two segments long when the format has sentence pairs.
  """
  d = config.data
  rows, length, preds = config.global_batch_size, d.seq_length, d.max_predictions_per_seq
  rng = np.random.default_rng(seed)
  vocab = train.bert_config(config).vocab_size
  k = d.max_examples_per_row if d.packing else 1
  starts = np.arange(k) * (length // k)
  example_BL = np.broadcast_to(np.searchsorted(starts, np.arange(length), side="right"), (rows, length))
  two_segments = np.arange(length) % (length // k) >= length // k // 2
  positions_BP = np.sort(np.stack([rng.choice(length, preds, replace=False) for _ in range(rows)]), axis=1)
  values = {
      "input_ids": rng.integers(1000, vocab, (rows, length)),
      "input_mask": np.ones((rows, length)),
      # Two segments per example for sentence pairs; one-segment formats have token type 0 only.
      "segment_ids": np.broadcast_to(two_segments & (d.format in base.SENTENCE_FORMATS), (rows, length)),
      "masked_lm_positions": positions_BP,
      "masked_lm_ids": rng.integers(1000, vocab, (rows, preds)),
      "masked_lm_weights": np.ones((rows, preds)),
      "example_ids": example_BL,
      "position_ids": np.arange(length) - starts[example_BL - 1],
      "next_sentence_positions": np.broadcast_to(starts, (rows, k)),
      "next_sentence_weights": np.ones((rows, k)),
      "next_sentence_labels": rng.integers(0, 2, (rows, k) if d.packing else (rows,)),
  }
  schema = objectives.get(config).batch_schema(d, rows)
  high = lambda f: vocab if f.high == "vocab" else f.high   # noqa: E731
  # Other fields: integers drawn in [0, high); float weights (an objective's own, as SpanBERT's boundary
  # targets) all at `high`, every slot a target, as the fields above.
  draw = lambda f: np.full(f.shape, f.high) if np.dtype(f.dtype).kind == "f" else rng.integers(0, high(f), f.shape)
  return {name: np.asarray(values[name] if name in values else draw(f), f.dtype) for name, f in schema.items()}


class TrainStepTimer:
  """Our real train step on a synthetic batch, warmed up (compiled); each call times one step."""

  def __init__(self, config: ml_collections.ConfigDict, warmup: int = 2, batch=None):
    mesh = sharding.create_mesh(config.mesh)
    self._s = s = train_setup.setup(config, mesh)
    init_rng, self._dropout_rng = train_setup.rngs(config)
    if s.init_frozen is not None:   # a teacher at random values: its shapes and dtype are what cost time
      self._s = s = s.with_frozen(s.init_frozen(init_rng))
    self._state = s.init(init_rng)
    self._batch = sharding.global_batch(synthetic_batch(config) if batch is None else batch, mesh)
    self._metrics = None
    for _ in range(warmup):
      self()

  def __call__(self) -> float:
    start = time.perf_counter()
    self._state, self._metrics = self._s.train_step(self._state, self._batch, self._dropout_rng)
    jax.block_until_ready((self._state, self._metrics))
    return time.perf_counter() - start

  def check_finite(self) -> None:
    if not np.isfinite(float(self._metrics["loss"])):
      raise FloatingPointError("the benchmarked train step produced a non-finite loss")


def time_train_steps(config: ml_collections.ConfigDict, steps: int, warmup: int = 2) -> list[float]:
  """Seconds of each of `steps` train steps (after `warmup` steps that include compilation)."""
  timer = TrainStepTimer(config, warmup)
  times = [timer() for _ in range(steps)]
  timer.check_finite()
  return times


def benchmark(config: ml_collections.ConfigDict, steps: int, peer_python: str | None = None) -> dict:
  """Step time (best and median), tokens/s and MFU against this machine's measured matmul peak; with
  `peer_python`, our steps alternate with the installed peers' (`bench_compare`) under "compare".

  One device: the peak is one device's and the peers run on one, so a step over several would read as N
  times the MFU and an N-to-1 comparison."""
  if jax.device_count() > 1:
    raise ValueError(f"bench train measures one device and {jax.device_count()} are visible: make one visible "
                     "(e.g. CUDA_VISIBLE_DEVICES=0, TPU_VISIBLE_CHIPS=0, or no "
                     "--xla_force_host_platform_device_count)")
  peak = MatmulPeak(2048 if jax.default_backend() == "cpu" else 8192, jnp.dtype(config.dtype))
  peaks = []
  batch = synthetic_batch(config)
  timer = TrainStepTimer(config, batch=batch)

  def ours() -> float:
    seconds = timer()
    peaks.append(peak())   # after the step is timed, so that the peak's matmuls stay out of its time
    return seconds

  comparison = None
  if peer_python is None:
    times = [ours() for _ in range(steps)]
  else:
    comparison = bench_compare.compare(config, batch, ours, steps, peer_python)
    times = comparison["systems"][bench_compare.OURS]["step_seconds"]
  timer.check_finite()
  best, median = min(times), statistics.median(times)
  cfg = train.bert_config(config)
  tokens = config.global_batch_size * config.data.seq_length
  step_flops = objectives.train_flops_per_step(config)
  result = {
      "objective": config.get("objective", "bert"), "data_format": config.data.format,
      "model": {"num_layers": cfg.num_layers, "hidden_size": cfg.hidden_size, "num_heads": cfg.num_heads,
                "intermediate_size": cfg.intermediate_size, "vocab_size": cfg.vocab_size,
                "dtype": str(cfg.dtype), "scan_layers": cfg.scan_layers, "scan_unroll": cfg.scan_unroll,
                "remat_policy": cfg.remat_policy, "dropout_bits": cfg.dropout_bits, "matmuls": cfg.matmuls},
      "dropout_rng": run_checks.dropout_rng(config),
      "global_batch_size": config.global_batch_size, "seq_length": config.data.seq_length,
      "max_predictions_per_seq": config.data.max_predictions_per_seq, "packing": config.data.packing,
      "mlm_all_positions": config.mlm_all_positions, "optimizer": config.optimizer.name,
      "devices": jax.device_count(), "steps": steps, "allocator": malloc.in_use(),
      "step_seconds_best": best, "step_seconds_median": median,
      "tokens_per_second": tokens / best, "tokens_per_second_median": tokens / median,
      "model_flops_per_step": step_flops,
  } | mfu_figures(step_flops, times, peaks)
  if comparison is not None:
    result["compare"] = comparison
  return result


FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command's flags, defined when the CLI runs it: importing `bench_train` defines none."""
  config_flags.DEFINE_config_file("config", None, "Pretraining config (default: the comparison model).")
  flags.DEFINE_integer("steps", 10, "Timed steps (after 2 warm-up steps); with --compare, per system.",
                       lower_bound=1)
  flags.DEFINE_bool("compare", False, "Also time the installed peers (Hugging Face Flax and PyTorch, KerasHub) on the "
                    "comparison model, alternating steps with ours; prints the ratios of medians.")
  flags.DEFINE_enum("dropout_bits", None, list(dropout.DROPOUT_BITS), "Our dropouts' bits (`model.dropout_bits`, "
                    "models/dropout.py); default: the config's. The peers draw theirs with threefry.")
  flags.DEFINE_enum("dropout_rng", None, list(run_checks.DROPOUT_RNGS), "Our dropout keys' implementation "
                    "(`dropout_rng`, models/dropout_key.py for 'hash'); default: the config's.")
  flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "The comparison model's compute dtype (the "
                    "peers compute in it too, each in its own mixed precision); with --config, the config's.")
  flags.DEFINE_string("peer_python", sys.executable, "The Python that runs the peers (a virtual environment "
                      "with transformers<5, keras-hub, torch); default: this one.")


def main(argv) -> None:
  if len(argv) > 1:
    raise ValueError(f"unexpected arguments: {argv[1:]}")
  # The peers take one example per row: so does our step when compared.
  # A file that is not there, or another kind of config: one line, exit 2.
  config = config_loading.load_config(FLAGS["config"], "bert-jax bench train", kind="pretrain")
  if config is None:
    config = comparison_config(packing=not FLAGS.compare, dtype=FLAGS.dtype)
  if FLAGS.dropout_bits is not None:
    config.model.dropout_bits = FLAGS.dropout_bits
  if FLAGS.dropout_rng is not None:
    config.dropout_rng = FLAGS.dropout_rng
  train.validate(config)   # what `pretrain` would refuse, refused before timing it
  result = benchmark(config, FLAGS.steps, FLAGS.peer_python if FLAGS.compare else None)
  print(json.dumps(result))

"""`bench train`'s synthetic batch is the batch the train step compiles against, for every objective."""

import json
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import failures, objectives, train, train_setup
from bert_jax.objectives import base
from bert_jax.tools import bench_train
from configs import tiny

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The fields each objective asks of a config (its `validate`), on top of the tiny config.
OBJECTIVES = {
    "bert": {},
    "roberta": {"data.format": "full_sentences", "model.type_vocab_size": 1},
    "spanbert": {"data.format": "doc_sentences", "data.span_masking": True},
    "ltr": {"data.format": "full_sentences", "model.causal": True},
    "albert": {"data.format": "sop", "model.share_layers": True, "model.embedding_size": 64},
    "electra": {"data.format": "full_sentences"},
    # No checkpoint: the teacher's size is a preset (compile-only uses).
    "distilbert": {"data.format": "full_sentences", "model.type_vocab_size": 0, "distill.teacher_preset": "tiny"},
    "modernbert": {"data.format": "doc_sentences", "model.type_vocab_size": 0, "model.rope_theta": 10000.0,
                   "model.geglu": True, "model.pre_norm": True, "model.final_norm": True,
                   "model.global_attn_every_n_layers": 2, "model.local_attention": 8},
}
CASES = [(name, packing) for name in objectives.NAMES for packing in (False, True)
         if name in OBJECTIVES and not (name == "ltr" and packing)]


def _config(objective: str, packing: bool):
  c = tiny.get_config()
  c.objective, c.data.packing, c.global_batch_size = objective, packing, 16
  for key, value in OBJECTIVES[objective].items():
    section, _, name = key.rpartition(".")
    c[section][name] = value
  train.validate(c, num_devices=8)
  return c


def test_every_objective_is_covered():
  missing = set(objectives.NAMES) - set(OBJECTIVES)
  assert not missing, f"add the config fields of objectives {sorted(missing)} to OBJECTIVES"


@pytest.mark.parametrize("objective,packing", CASES)
def test_synthetic_batch_has_the_abstract_batch_layout(objective, packing):
  config = _config(objective, packing)
  batch, abstract = bench_train.synthetic_batch(config), train_setup.abstract_batch(config)
  assert list(batch) == list(abstract)
  for name, spec in abstract.items():
    assert (batch[name].shape, batch[name].dtype) == (spec.shape, spec.dtype), name


@pytest.mark.parametrize("objective,packing", CASES)
def test_synthetic_batch_values_lie_in_the_schema_ranges(objective, packing):
  config = _config(objective, packing)
  batch = bench_train.synthetic_batch(config)
  vocab = train.bert_config(config).vocab_size
  for name, field in objectives.get(config).batch_schema(config.data, config.global_batch_size).items():
    high = vocab if field.high == "vocab" else field.high
    values = batch[name]
    # Integers lie in [0, high); float weights in [0, high].
    assert 0 <= values.min() and (values.max() <= high if values.dtype.kind == "f" else values.max() < high), name
    if values.dtype.kind == "f":   # weights: every slot a target, so the step computes every loss term
      assert values.min() > 0, name
  # One-segment formats have one token type (RoBERTa's type vocabulary has a single entry).
  if config.data.format in base.SINGLE_FORMATS:
    np.testing.assert_array_equal(batch["segment_ids"], 0)
  else:
    assert set(np.unique(batch["segment_ids"])) == {0, 1}


@pytest.mark.slow
def test_times_a_distillation_step_with_a_random_teacher():
  config = _config("distilbert", False)
  config.mesh.data, config.mesh.fsdp = -1, 2   # the 8 test devices
  times = bench_train.time_train_steps(config, steps=1, warmup=1)
  assert len(times) == 1 and times[0] > 0


def test_mfu_sets_each_step_against_the_peak_sampled_beside_it():
  # Step i took times[i] s; the matmul peak sampled right after it was peaks[i] FLOP/s.
  figures = bench_train.mfu_figures(step_flops=100.0, times=[1.0, 2.0, 4.0], peaks=[200.0, 100.0, 25.0])
  # Per-step shares: 100/1/200 = 0.5, 100/2/100 = 0.5, 100/4/25 = 1.0.
  assert figures["mfu_median"] == 0.5 and figures["mfu"] == 0.5   # the best step (1 s) against its own sample
  assert figures["matmul_peak_flops"] == 100.0 and figures["matmul_peak_flops_best"] == 200.0
  assert figures["mfu_median_against_best_peak"] == 100.0 / 2.0 / 200.0
  with pytest.raises(ValueError, match="one peak sample per step"):
    bench_train.mfu_figures(100.0, [1.0, 2.0], [10.0])


def test_benchmark_samples_the_peak_after_each_timed_step(monkeypatch):
  events = []

  class Timer:
    def __init__(self, config, warmup=2, batch=None):
      pass

    def __call__(self):
      events.append("step")
      return 2.0

    def check_finite(self):
      pass

  class Peak:
    def __init__(self, n, dtype):
      events.append(("peak in", n, dtype))

    def __call__(self):
      events.append("peak")
      return 1e9

  monkeypatch.setattr(bench_train, "TrainStepTimer", Timer)
  monkeypatch.setattr(bench_train, "MatmulPeak", Peak)
  config = _config("bert", False)
  config.dtype = "bfloat16"
  # The tests' 8 CPU devices: one device's peak against a step over 8 would read as 8 times the MFU.
  with pytest.raises(ValueError, match="measures one device and 8 are visible"):
    bench_train.benchmark(config, steps=3)
  monkeypatch.setattr(bench_train.jax, "device_count", lambda: 1)
  result = bench_train.benchmark(config, steps=3)
  # The peak in the step's compute dtype, then one sample after each timed step.
  assert events == [("peak in", 2048, np.dtype(jnp.bfloat16))] + ["step", "peak"] * 3
  flops = objectives.train_flops_per_step(config)
  assert result["mfu_median"] == pytest.approx(flops / 2.0 / 1e9)
  assert result["matmul_peak_flops"] == 1e9 and result["step_seconds_median"] == 2.0


class _Clock:
  """A clock that moves only while the device is waited on: a timing that does not wait reads 0 s."""

  def __init__(self, seconds_a_wait: float):
    self.now, self.seconds = 0.0, seconds_a_wait

  def perf_counter(self) -> float:
    return self.now

  def wait(self, x):
    self.now += self.seconds
    return x


def test_the_matmul_peak_waits_for_each_product_and_counts_2n3_flops(monkeypatch):
  peak = bench_train.MatmulPeak(n=64, repeats=2)
  clock = _Clock(0.5)
  monkeypatch.setattr(bench_train.time, "perf_counter", clock.perf_counter)
  peak._matmul = lambda a, b: type("Pending", (), {"block_until_ready": lambda self: clock.wait(self)})()
  assert peak() == 2 * 64**3 / 0.5


@pytest.mark.slow
def test_a_timed_step_waits_for_the_state_and_the_metrics(monkeypatch):
  timer = bench_train.TrainStepTimer(_config("bert", False), warmup=1)
  clock = _Clock(0.25)
  waited = []
  monkeypatch.setattr(bench_train.time, "perf_counter", clock.perf_counter)
  monkeypatch.setattr(bench_train.jax, "block_until_ready", lambda x: waited.append(x) or clock.wait(x))
  assert timer() == 0.25
  state, metrics = waited[0]
  assert "loss" in metrics and state is timer._state


def test_the_command_refuses_a_config_pretrain_refuses():
  """`bench train` timed a config that `pretrain` stops (here ModernBERT's objective on BERT's encoder and
  data format); it stops it the same way, before compiling."""
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  run = subprocess.run([sys.executable, "-m", "bert_jax.cli", "bench", "train", "--config=configs/tiny.py",
                        "--steps=1", "--config.objective=modernbert"], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=300)
  assert run.returncode == failures.USER_ERROR, run.stderr[-3000:]
  assert "data.format 'nsp' cannot be used by objective 'modernbert'" in run.stderr
  assert "Traceback" not in run.stderr and "step_seconds" not in run.stdout


@pytest.mark.slow
def test_the_command_times_the_dropout_keys_and_bits_it_is_given():
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  run = subprocess.run([sys.executable, "-m", "bert_jax.cli", "bench", "train", "--config=configs/tiny.py",
                        "--steps=1", "--dropout_rng=hash", "--dropout_bits=hash"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
  assert run.returncode == 0, run.stderr[-3000:]
  result = json.loads(run.stdout.strip().splitlines()[-1])
  assert (result["dropout_rng"], result["model"]["dropout_bits"]) == ("hash", "hash")

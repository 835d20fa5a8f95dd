"""`bert-jax bench kernel` compiles the flash kernels, or LayerNorm's backward kernel, for a TPU chip here and
reads the compiler's schedule."""

import json
import os
import subprocess
import sys

import pytest

from bert_jax.tools import bench_kernel
from conftest import REPO_ROOT

DUMP = """== CAPACTIY:
MATMUL, MATPUSH, XLU, VALU
    2     2     1     2
== UTILIZATION:
0 0 0 1
2 1 0 2
1 0 1 0
"""


def test_parse_schedule_counts_bundles_and_slots(tmp_path):
  path = tmp_path / "x-final_hlo-static-per-bundle-utilization.txt"
  path.write_text(DUMP)
  s = bench_kernel.parse_schedule(str(path))
  assert s == {"bundles": 3, "slots": {"MATMUL": 3, "MATPUSH": 1, "XLU": 1, "VALU": 3},
               "capacity": {"MATMUL": 2, "MATPUSH": 2, "XLU": 1, "VALU": 2}}


def _run(*flags):
  """`bench kernel` with these flags in a process of its own: its JSON lines."""
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  proc = subprocess.run([sys.executable, "-m", "bert_jax.cli", "bench", "kernel", *flags], cwd=REPO_ROOT, env=env,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return [json.loads(line) for line in proc.stdout.strip().splitlines()]


def _bench(*flags):
  rows = _run("--topology=v5e:2x2", "--seq_length=256", "--heads=2", "--head_dim=64", *flags)
  return {(r["kernel"], r["rate"]): r for r in rows}


@pytest.mark.slow
def test_bench_kernel_reads_the_schedule_of_both_kernels():
  rows = _bench("--splash")
  splash = rows.pop(("splash", 0.0))
  assert set(splash["bundles_per_step"]) == {"splash_mha_fwd_segmented_residuals",
                                             "splash_mha_dq_segmented_no_residuals",
                                             "splash_mha_dkv_segmented_no_residuals"}
  assert splash["grid_steps_per_example"] == 2 and splash["bundles_per_example"] > 0
  assert set(rows) == {("forward", 0.1), ("backward", 0.1), ("forward", 0.0), ("backward", 0.0)}
  for r in rows.values():
    assert r["device_kind"] == "TPU v5 lite" and r["block_q"] == 256 and r["grid_steps_per_example"] == 2
    assert r["hardware_rng_ops"] == 0
    assert r["slots_per_step"]["MATMUL"] > 0 and r["bundles_per_step"] >= r["matmul_bundles"] > 0
    assert r["bundles_per_example"] == 2 * r["bundles_per_step"]
  for kernel in ("forward", "backward"):   # the dropout hash costs vector work
    assert rows[kernel, 0.1]["slots_per_step"]["VALU"] > rows[kernel, 0.0]["slots_per_step"]["VALU"]
  # The backward kernel makes 5 matmuls to the forward's 2.
  assert rows["backward", 0.0]["matmul_bundles"] > 2 * rows["forward", 0.0]["matmul_bundles"]


@pytest.mark.slow
def test_hardware_bits_draw_from_the_tpus_generator():
  """With `--bits=hardware` (`model.flash_bits`) the compiled kernels draw from
  the hardware generator, and the hash's vector work is gone. Head dimension 32: the weighted sums take
  their (x.T @ w).T form (the other test compiles the plain one)."""
  hardware = _bench("--bits=hardware", "--rate=0.1", "--head_dim=32")
  hashed = _bench("--rate=0.1", "--head_dim=32")
  for kernel in ("forward", "backward"):
    assert hardware[kernel, 0.1]["hardware_rng_ops"] > 0 and hardware[kernel, 0.0]["hardware_rng_ops"] == 0
    assert hardware[kernel, 0.1]["slots_per_step"]["VALU"] < hashed[kernel, 0.1]["slots_per_step"]["VALU"]


def _layer_norm_bench(rows, features, gradients):
  return _run("--topology=v3:2x2", "--layer_norm", f"--rows={rows}", f"--features={features}",
              f"--gradients={gradients}")[-1]


@pytest.mark.slow
def test_bench_kernel_reads_the_layer_norm_kernels_schedule():
  pytest.importorskip("libtpu")
  rows = {n: _layer_norm_bench(96, 256, n) for n in (1, 2)}
  for n, r in rows.items():
    assert r["device_kind"] == "TPU v3" and r["kernel"] == "layer_norm_backward" and r["gradients"] == n
    assert r["compiled_shape"] == [96, 256]
    assert r["block_rows"] == 32 and r["grid_steps"] == 3 and r["bundles_per_norm"] == 3 * r["bundles_per_step"]
    assert r["slots_per_step"]["VALU"] > 0 and r["activation_bytes"] == (n + 2) * 96 * 256 * 2
    # XLA's count of the call: at least the activations, the scale on 8 sublanes and 3 blocks' two [8, 256]
    # float32 column sums, which the kernel declares; the XLA ops around it (the scale's broadcast, the sums'
    # addition) add a little.
    declared = r["activation_bytes"] + 8 * 256 * 4 + 2 * 3 * 8 * 256 * 4
    assert declared <= r["xla_bytes"] < 1.25 * declared
  # The second gradient is read and added: more loads and vector work.
  assert rows[2]["slots_per_step"]["VLOAD"] > rows[1]["slots_per_step"]["VLOAD"]
  assert rows[2]["slots_per_step"]["VALU"] > rows[1]["slots_per_step"]["VALU"]
  # Rows no block divides are padded to 8 (250 -> 256: one 256-row step); features not a multiple of 128.
  padded = _layer_norm_bench(250, 320, 2)
  assert padded["compiled_shape"] == [250, 320] and padded["block_rows"] == 256 and padded["grid_steps"] == 1
  assert padded["bundles_per_step"] > rows[2]["bundles_per_step"]

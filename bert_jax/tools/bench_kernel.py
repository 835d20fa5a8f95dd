"""`bert-jax bench kernel`: the TPU compiler's schedule of the flash attention kernels, from this CPU.

    bert-jax bench kernel --topology=v3:2x2 --seq_length=512 --heads=16 --head_dim=64
    bert-jax bench kernel --topology=v3:2x2 --layer_norm --rows=512 --features=1024 --gradients=2

`bert-jax aot` counts the flash kernel (models/flash_dropout.py) as its matmuls at the MXU's peak, as if
nothing else in it took time. This compiles the forward and backward kernels for one chip of a topology
(`pip install libtpu`), with and without dropout, asks libtpu to dump the scheduled code
(`--xla_jf_dump_to`), and prints one JSON line per kernel: the VLIW bundles of the body of one grid step
(one example, one head, one block of queries against all keys) and the slots they fill (MXU pushes,
vector ALU, transcendental unit, vector loads and stores, and the spills and fills among them).

A bundle issues in one cycle at best, so a grid step takes at least that many cycles; stalls (DMA waits,
MXU results not ready) add to it and are not in the dump. "matmul_bundles" is the fewest bundles the
step's MXU pushes fit in (pushes / MXU slots a bundle); "bundles_over_matmul" how far the schedule is
above that, i.e. how much more than its matmuls the kernel costs if its bundles set the pace. Figures
from the compiler, not a measurement on a TPU.

`--layer_norm` compiles LayerNorm's backward kernel instead (models/layer_norm_kernel.py) on one shard's
[rows, features] bfloat16 rows with one or two gradients, and gives its bundles a grid step and a norm beside
its bytes: x, the gradients and dx, and XLA's count of the compiled call (those, the scale, the column sums
and the XLA ops around the kernel), which the step's estimate charges at HBM bandwidth.
"""

import glob
import json
import os
import re
import subprocess
import sys
import tempfile

from absl import flags

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command's flags, defined when the CLI runs it: importing this module (as the tests do) defines none."""
  flags.DEFINE_string("topology", "v5e:2x2", "TPU topology whose chip the kernels are compiled for.")
  flags.DEFINE_integer("seq_length", 512, "Sequence length.")
  flags.DEFINE_integer("heads", 16, "Heads of one example (one grid step each, times the query blocks).")
  flags.DEFINE_integer("head_dim", 64, "Head dimension.")
  flags.DEFINE_float("rate", 0.1, "Attention dropout rate (also compiled without dropout).")
  flags.DEFINE_string("dtype", "bfloat16", "Compute dtype of queries, keys and values.")
  flags.DEFINE_enum("bits", "hash", ["hash", "hardware"], "Dropout bits: the portable hash, or the TPU's "
                    "generator (`model.flash_bits`).")
  flags.DEFINE_bool("splash", False, "Also Pallas' splash kernel (models/splash.py; no dropout) on the same "
                    "shape, for comparison.")
  flags.DEFINE_bool("layer_norm", False, "LayerNorm's backward kernel instead of the flash kernels.")
  flags.DEFINE_integer("rows", 512, "--layer_norm: rows of one shard (batch x length).")
  flags.DEFINE_integer("features", 1024, "--layer_norm: features (the hidden size).")
  flags.DEFINE_integer("gradients", 2, "--layer_norm: gradients of the norm's output, 1 or 2 (a post-LN layer's).",
                       lower_bound=1, upper_bound=2)
  flags.DEFINE_string("child", "", "Internal: compile this kernel (forward, backward, splash, layer_norm) and exit.")
  flags.DEFINE_float("child_rate", 0.0, "Internal: the child's dropout rate.")


KERNELS = ("forward", "backward")


def _compile(kernel: str, rate: float) -> None:
  """Compile one kernel for one chip of --topology (run in a child whose libtpu dumps its schedule)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from bert_jax.models import flash_dropout  # pylint: disable=g-import-not-at-top
  from bert_jax.models import splash  # pylint: disable=g-import-not-at-top
  from bert_jax.tools import aot  # pylint: disable=g-import-not-at-top
  device = aot.topology_devices(FLAGS.topology)[0]
  sharding = jax.sharding.SingleDeviceSharding(device)
  if kernel == "layer_norm":
    from bert_jax.models import layer_norm_kernel  # pylint: disable=g-import-not-at-top
    rows = jax.ShapeDtypeStruct((FLAGS.rows, FLAGS.features), jnp.bfloat16, sharding=sharding)
    scale = jax.ShapeDtypeStruct((FLAGS.features,), jnp.float32, sharding=sharding)
    backward = lambda x, dys, s: layer_norm_kernel.gradient(x, dys, s, 1e-12, "pallas")  # noqa: E731
    compiled = jax.jit(backward).lower(rows, (rows,) * FLAGS.gradients, scale).compile()
    print(json.dumps({"device_kind": device.device_kind, "compiled_shape": list(rows.shape),
                      "bytes_accessed": compiled.cost_analysis().get("bytes accessed")}))
    return
  shape = (1, FLAGS.heads, FLAGS.seq_length, FLAGS.head_dim)
  x = jax.ShapeDtypeStruct(shape, jnp.dtype(FLAGS.dtype), sharding=sharding)
  segments = jax.ShapeDtypeStruct(shape[:1] + shape[2:3], jnp.int32, sharding=sharding)
  seeds = jax.ShapeDtypeStruct(shape[:2] + (2,), jnp.int32, sharding=sharding)

  def flash_forward(q, k, v, s, seeds):
    return flash_dropout.forward(q, k, v, s, seeds, rate, False, FLAGS.bits)

  def flash_backward(q, k, v, s, seeds, do):
    return flash_dropout.backward(q, k, v, s, seeds, do, rate, False, FLAGS.bits)

  def splash_attention(q, k, v, s):   # [B, L, N, K]; forward and backward
    mask = splash.SegmentMask(s)
    loss = lambda q, k, v: jnp.sum(splash.attention(q, k, v, mask).astype(jnp.float32))
    return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

  if kernel == "splash":
    y = jax.ShapeDtypeStruct((shape[0], shape[2], shape[1], shape[3]), x.dtype, sharding=sharding)
    fn, args = splash_attention, (y, y, y, segments)
  elif kernel == "forward":
    fn, args = flash_forward, (x, x, x, segments, seeds)
  else:
    fn, args = flash_backward, (x, x, x, segments, seeds, x)
  with flash_dropout.compiling_for(device.device_kind):
    jax.jit(fn).lower(*args).compile()
  print(json.dumps({"device_kind": device.device_kind}))


def parse_schedule(path: str) -> dict:
  """Bundles and slot totals of one `*final_hlo-static-per-bundle-utilization.txt` dump."""
  with open(path) as f:
    lines = f.read().splitlines()
  names = capacity = None
  rows, in_rows = [], False
  for i, line in enumerate(lines):
    if line.startswith("== CAPAC"):   # sic
      names = [n.strip() for n in lines[i + 1].split(",")]
      capacity = [int(c) for c in lines[i + 2].split()]
    elif line.startswith("=="):
      in_rows = line.startswith("== UTILIZATION")
    elif in_rows and names and re.fullmatch(r"[\d ]+", line.strip() or "x") and len(line.split()) == len(names):
      rows.append([int(c) for c in line.split()])
  if not names:
    raise ValueError(f"{path}: no slot names")
  totals = {n: sum(r[j] for r in rows) for j, n in enumerate(names)}
  return {"bundles": len(rows), "slots": totals, "capacity": dict(zip(names, capacity))}


def _compile_in_child(kernel: str, rate: float, dump_dir: str) -> dict:
  """Compile `kernel` in a child process with libtpu's schedule dump in `dump_dir`; the device it was for."""
  env = dict(os.environ)
  env["LIBTPU_INIT_ARGS"] = (env.get("LIBTPU_INIT_ARGS", "") +
                             f" --xla_jf_dump_to={dump_dir} --xla_jf_dump_llo_text=true").strip()
  env.pop("XLA_FLAGS", None)
  flags_ = [f"--topology={FLAGS.topology}", f"--seq_length={FLAGS.seq_length}", f"--heads={FLAGS.heads}",
            f"--head_dim={FLAGS.head_dim}", f"--dtype={FLAGS.dtype}", f"--bits={FLAGS.bits}", f"--child={kernel}",
            f"--child_rate={rate}", f"--rows={FLAGS.rows}", f"--features={FLAGS.features}",
            f"--gradients={FLAGS.gradients}"]
  proc = subprocess.run([sys.executable, "-m", "bert_jax.cli", "bench", "kernel", *flags_], env=env,
                        capture_output=True, text=True, timeout=600)
  if proc.returncode:
    raise RuntimeError(f"compiling the {kernel} kernel failed:\n{proc.stderr[-3000:]}")
  return json.loads(proc.stdout.strip().splitlines()[-1])


def schedule(kernel: str, rate: float, dump_dir: str) -> dict:
  """Compile the flash `kernel` with libtpu's schedule dump in `dump_dir`; its schedule."""
  device = _compile_in_child(kernel, rate, dump_dir)
  dumps = glob.glob(os.path.join(dump_dir, f"*flash_{kernel}*final_hlo-static-per-bundle-utilization.txt"))
  if not dumps:
    raise RuntimeError(f"libtpu wrote no schedule of the {kernel} kernel to {dump_dir}")
  dump = max(dumps, key=os.path.getsize)
  # The scheduled instructions beside it: how many draw from the hardware generator (`vrng`).
  code = glob.glob(dump.split("-final_hlo-")[0].rsplit("-", 1)[0] + "-*-final_bundles.txt")
  rng = 0
  for path in code:
    with open(path) as f:
      rng += f.read().count("vrng")
  return {**device, **parse_schedule(dump), "hardware_rng_ops": rng}


def _shape_fields() -> dict:
  return {"topology": FLAGS.topology, "seq_length": FLAGS.seq_length, "heads": FLAGS.heads,
          "head_dim": FLAGS.head_dim, "dtype": FLAGS.dtype}


def report(kernel: str, rate: float, s: dict) -> dict:
  from bert_jax.models import flash_dropout  # pylint: disable=g-import-not-at-top
  length = FLAGS.seq_length
  block = flash_dropout.block_q(length, rate)
  mxu = s["capacity"].get("MATMUL") or 1
  matmul_bundles = s["slots"].get("MATMUL", 0) / mxu
  steps = FLAGS.heads * (length // block)
  return {
      **_shape_fields(), "device_kind": s["device_kind"], "kernel": kernel, "rate": rate,
      "bits": FLAGS.bits if rate > 0 else None, "block_q": block, "grid_steps_per_example": steps,
      "bundles_per_step": s["bundles"],
      "bundles_per_example": s["bundles"] * steps, "slots_per_step": s["slots"], "slot_capacity": s["capacity"],
      "hardware_rng_ops": s["hardware_rng_ops"],
      "matmul_bundles": matmul_bundles,
      "bundles_over_matmul": s["bundles"] / matmul_bundles if matmul_bundles else None,
  }


def splash_report(dump_dir: str) -> dict:
  """Pallas' splash kernels (forward, dq, dkv) on the same shape, no dropout: bundles a grid step and an
  example (each kernel's grid: heads x query blocks x key blocks, none skipped under a full mask)."""
  from bert_jax.models import splash  # pylint: disable=g-import-not-at-top
  device = _compile_in_child("splash", 0.0, dump_dir)
  kernels = {}
  for path in glob.glob(os.path.join(dump_dir, "*splash_mha_*final_hlo-static-per-bundle-utilization.txt")):
    name = re.search(r"(splash_mha_[a-z_]+)", os.path.basename(path)).group(1)
    kernels[name] = parse_schedule(path)["bundles"]
  if not kernels:
    raise RuntimeError(f"libtpu wrote no schedule of the splash kernels to {dump_dir}")
  block = splash.block_size(FLAGS.seq_length)
  steps = FLAGS.heads * (FLAGS.seq_length // block) ** 2
  return {**_shape_fields(), **device, "kernel": "splash", "rate": 0.0, "bits": None, "block": block,
          "grid_steps_per_example": steps, "bundles_per_step": kernels,
          "bundles_per_example": sum(kernels.values()) * steps}


def layer_norm_report(dump_dir: str) -> dict:
  """LayerNorm's backward kernel on [--rows, --features]: its bundles a grid step and a norm, its bytes."""
  from bert_jax.models import layer_norm_kernel  # pylint: disable=g-import-not-at-top
  device = _compile_in_child("layer_norm", 0.0, dump_dir)
  dumps = glob.glob(os.path.join(dump_dir, "*layer_norm_backward*final_hlo-static-per-bundle-utilization.txt"))
  if not dumps:
    raise RuntimeError(f"libtpu wrote no schedule of the LayerNorm kernel to {dump_dir}")
  s = parse_schedule(max(dumps, key=os.path.getsize))
  rows, features, n = FLAGS.rows, FLAGS.features, FLAGS.gradients
  padded, block = layer_norm_kernel.grid(rows, features)
  steps = padded // block
  return {"topology": FLAGS.topology, **device, "kernel": "layer_norm_backward", "rows": rows,
          "features": features, "gradients": n, "block_rows": block, "grid_steps": steps,
          "bundles_per_step": s["bundles"], "bundles_per_norm": s["bundles"] * steps,
          "slots_per_step": s["slots"], "slot_capacity": s["capacity"],
          # x, the gradients and dx (bfloat16); XLA's count of the compiled call adds the scale, the column
          # sums and the XLA ops around the kernel (the scale's broadcast, the sums' addition)
          "activation_bytes": (n + 2) * rows * features * 2, "xla_bytes": device["bytes_accessed"]}


def main(argv) -> None:
  del argv
  if FLAGS.child:
    _compile(FLAGS.child, FLAGS.child_rate)
    return
  if FLAGS.layer_norm:
    with tempfile.TemporaryDirectory() as dump_dir:
      print(json.dumps(layer_norm_report(dump_dir)), flush=True)
    return
  for rate in (FLAGS.rate, 0.0) if FLAGS.rate > 0 else (0.0,):
    for kernel in KERNELS:
      with tempfile.TemporaryDirectory() as dump_dir:
        print(json.dumps(report(kernel, rate, schedule(kernel, rate, dump_dir))), flush=True)
  if FLAGS.splash:
    with tempfile.TemporaryDirectory() as dump_dir:
      print(json.dumps(splash_report(dump_dir)), flush=True)

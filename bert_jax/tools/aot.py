"""`bert-jax aot`: compile the real train step for a TPU topology on this machine, before renting it.

    bert-jax aot --config=configs/bert_large.py:phase2 --topology=v3:8x8

libtpu compiles for a described topology with no TPU attached (`jax.experimental.topologies`): the
train step of `train_setup.setup` is lowered with abstract state and batch on a mesh over the topology's
devices and compiled by the TPU compiler. The report gives, per device, XLA's buffer assignment
(arguments, outputs, temporaries, code) against the HBM of that device, and an estimated step time:
the larger of compute time (FLOPs / peak) and memory time (bytes accessed / HBM bandwidth).

The estimate ignores collectives over ICI/DCN and assumes the MXUs can be kept busy; it is an upper
bound on speed. XLA's cost analysis counts the body of a loop once (a scanned layer stack, gradient
accumulation). XLA's FLOPs are therefore multiplied by `micro_batches` (the accumulation loop's trip
count), or by more where that still falls short of the analytic model FLOPs (the objective's, `flops.py`;
a scanned layer stack); at that floor the compute time is the model FLOPs at peak. The bytes of a step
with a loop are our own count from its optimized HLO (`hlo_bytes`), which counts each loop body once per
trip; that of a step without one is XLA's. Both count the TPU's tile padding. Where a loop's trip
count cannot be read from the HLO, XLA's bytes are scaled as its FLOPs are. The report says which.

On v5e and v6e the TPU compiler places most of a step's arrays in its alternate memory space (`S(1)` in
their layouts: each core's 128 MiB of VMEM), where XLA's bytes count them alike with HBM's. The report
then also gives the step's bytes outside on-chip memory (the step's bytes times the share `hlo_bytes`
counts outside it) and the step and MFU bound they give with on-chip traffic at no cost: a bound no
step runs faster than. The first estimate charges on-chip traffic at HBM bandwidth; neither counts the
vector units' work or the collectives' time on ICI.

The compile runs with a faster malloc than glibc's where one is installed (jemalloc, tcmalloc, or TBB's from
the `tpu` extra; `malloc.reexec`): the compiler allocates small objects by the million,
and BERT-large's phase 1 for v3:8x8 compiles in about three quarters of the time. The report names it;
`BERT_JAX_MALLOC=system` keeps the C library's.

When the step does not fit, the TPU compiler stops and says how much it needed (for temporaries, the
usual case); the report then gives that figure and no time, and the command exits with status 1.
"""

import contextlib
import json
import importlib.util
import os
import sys
import tempfile
import time
from typing import Any

from absl import flags
from ml_collections import config_flags

from bert_jax import config_loading
from bert_jax import config_path
from bert_jax import failures
from bert_jax import malloc
from bert_jax import paths
from bert_jax.tpu_chips import CHIPS, GiB, parse_topology  # noqa: F401 (aot.CHIPS, aot.parse_topology)
from bert_jax.tools import compile_passes as compile_passes_lib
from bert_jax.tools import hlo_bytes
from bert_jax.tools import step_cost
from bert_jax.tools import hlo_flops

config_path.put_config_root_on_path(sys.argv)   # config files do `from configs import common`


def topology_devices(topology: str) -> list[Any]:
  """Compile-only devices of a TPU topology such as "v3:8x8" (no TPU needed, libtpu must be installed)."""
  _, chip, shape = parse_topology(topology)
  if importlib.util.find_spec("libtpu") is None and not os.path.isfile(os.environ.get("TPU_LIBRARY_PATH", "")):
    # JAX would say "TPU support not installed", in a traceback
    raise failures.UserError(f"compiling for {topology} needs libtpu, the TPU compiler: pip install libtpu (or the "
                             "project's tpu extra: pip install -e '.[tpu]'); no TPU is needed")
  # libtpu takes a process-wide lock unless told other processes may load it too, and warns about
  # the missing TPU VM metadata; neither matters for compiling.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  os.environ.setdefault("TPU_ACCELERATOR_TYPE", chip.host_type)
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  import jax  # pylint: disable=g-import-not-at-top
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  kwargs = dict(chip_config_name="megacore", chips_per_host_bounds=(2, 2, 1)) if chip.megacore else {}
  try:
    description = topologies.get_topology_desc(topology_name=f"{chip.libtpu_name}:{shape}", platform="tpu",
                                               **kwargs)
  except jax.errors.JaxRuntimeError as e:   # a shape libtpu has no layout for, e.g. v3:3x3
    raise failures.UserError(f"topology {topology!r}: libtpu has no such slice ({first_line(e)}); slices are "
                             "multiples of a host's chips, e.g. v3:2x2, v3:4x4, v5e:8x8, v4:4x4x4") from e
  return list(description.devices)


def lower_train_step(config, devices) -> tuple[Any, float]:
  """The real train step of `train_setup.setup`, lowered for `devices` with abstract state and batch, and the
  seconds that took (setup, tracing, lowering to StableHLO)."""
  import jax  # pylint: disable=g-import-not-at-top
  from bert_jax import sharding, train_setup  # pylint: disable=g-import-not-at-top
  start = time.perf_counter()
  mesh = sharding.create_mesh(config.mesh, devices=devices)
  pieces = train_setup.setup(config, mesh)
  rng = jax.eval_shape(lambda: train_setup.rngs(config)[1])
  lowered = pieces.train_step.lower(pieces.abstract_state, train_setup.abstract_batch(config), rng)
  return lowered, time.perf_counter() - start


def compile_train_step(config, devices) -> tuple[Any, float]:
  """`lower_train_step`'s step compiled, and the seconds spent before XLA's compiler starts."""
  lowered, lower_s = lower_train_step(config, devices)
  return lowered.compile(), lower_s


def first_line(error: Exception) -> str:
  """An error's first line (its type's name when it has no message): what a report or a search's log shows."""
  return (str(error).strip().splitlines() or [type(error).__name__])[0]


def hlo_text(compiled) -> tuple[str, str | None]:
  """(the compiled step's optimized HLO text, None), or ("", the error's first line) where it cannot be
  read back: libtpu compiles some steps whose HLO it then fails to print (v6e:8x8 BERT-large phase 1 with
  the word-embedding lookup on shards: "INTERNAL: RET_CHECK failure ... async-update instruction should
  have 1 operands but sees 3"). The step compiled; its report keeps XLA's count and says what it lacks."""
  try:
    return compiled.as_text(), None
  except Exception as e:  # pylint: disable=broad-except
    return "", first_line(e)[:300]


def run(config, topology: str, report_top: int = 0, hlo_path: str = "", compile_passes: bool = False
        ) -> dict[str, Any]:
  """Compile `config`'s train step for `topology` and return the report (see module docstring).

  `report_top` > 0 adds "traffic": the compiled step's memory traffic by op (`hlo_bytes`), that many
  largest ops, sources and kinds. `hlo_path`: also write the optimized HLO text there. `compile_passes`
  adds "compile_passes": where XLA's compile time went (`compile_passes`), its HLO passes timed by XLA.
  """
  from bert_jax import run_checks, sharding  # pylint: disable=g-import-not-at-top
  generation, chip, _ = parse_topology(topology)
  devices = topology_devices(topology)
  n, hbm = len(devices), chip.hbm_bytes / chip.cores
  run_checks.validate(config, num_devices=n)   # what `pretrain` would refuse, refused before compiling it
  report = {
      "topology": topology, "device_kind": devices[0].device_kind, "devices": n,
      "chips": n // chip.cores, "devices_per_chip": chip.cores, "chip_source": chip.source,
      "mesh": dict(zip(sharding.MESH_AXES, sharding.mesh_shape(config.mesh, n))),
      "micro_batches": int(config.micro_batches),
      "global_batch_size": config.global_batch_size, "seq_length": config.data.seq_length,
      "generation": generation, "allocator": malloc.in_use(),
  }
  start = time.perf_counter()
  try:
    compiled, lower_s, compile_s, passes = _compile(config, devices, compile_passes)
  except Exception as e:  # pylint: disable=broad-except
    if (memory := step_cost.out_of_memory_report(e, hbm)) is None:
      raise
    return {**report, "compile_seconds": time.perf_counter() - start, "memory_per_device": memory,
            "time_per_step": None, "tokens_per_second": None}
  tokens = config.global_batch_size * config.data.seq_length
  text, hlo_error = hlo_text(compiled)
  traffic = hlo_bytes.summarize(hlo_bytes.traffic(text), report_top) if text else None
  timing = _time_per_step(config, compiled, chip, n, text, traffic)
  report = {
      **report, "compile_seconds": compile_s, "lower_seconds": lower_s,
      "memory_per_device": step_cost.memory_report(compiled, hbm),
      "time_per_step": timing,
      "tokens_per_second": tokens / timing["step_seconds"] if timing["step_seconds"] else 0.0,
  }
  if hlo_error:
    report["hlo_text_error"] = hlo_error
  if hlo_path and text:
    with open(hlo_path, "w") as f:
      f.write(text)
  if report_top > 0 and traffic:
    report["traffic"] = traffic
  if passes is not None:
    report["compile_passes"] = passes
  return report


def _compile(config, devices: list[Any], compile_passes: bool) -> tuple[Any, float, float, dict | None]:
  """(compiled train step, seconds to lower it, seconds to lower and compile it, where XLA's compile time
  went or None): with `compile_passes`, XLA times its HLO passes into a temporary directory."""
  start = time.perf_counter()
  with (tempfile.TemporaryDirectory(prefix="bert_jax_passes-") if compile_passes else contextlib.nullcontext()) as dump:
    lowered, lower_s = lower_train_step(config, devices)
    window = [time.time()]   # XLA's compile alone, in the clock of its pass timings
    compiled = lowered.compile(compiler_options=compile_passes_lib.dump_options(dump) if compile_passes else None)
    window.append(time.time())
    compile_s = time.perf_counter() - start
    passes = None
    if compile_passes:
      try:
        passes = compile_passes_lib.summarize(compile_passes_lib.read(dump), *window)
      except ValueError as e:   # e.g. a persistent compilation cache's hit: no pass ran
        passes = {"error": str(e)}
  return compiled, lower_s, compile_s, passes


def _time_per_step(config, compiled, chip, n: int, text: str | None, traffic: dict | None) -> dict[str, Any]:
  """`step_cost.time_report` of the compiled step on `n` devices of `chip`: the model's FLOPs a device, the
  attention kernels' work, a loop's bytes and FLOPs per trip from the HLO `text`, and the share of its
  `traffic` on chip."""
  from bert_jax import objectives  # pylint: disable=g-import-not-at-top
  per_row = objectives.kernel_attention_per_row(config)
  on_chip_share = None
  if traffic:
    on_chip_share = traffic["on_chip_bytes"] / traffic["total_bytes"] if traffic["total_bytes"] else 0.0
  return step_cost.time_report(compiled, chip, objectives.train_flops_per_step(config) / n, int(config.micro_batches),
                               kernel={k: v * config.global_batch_size / n for k, v in per_row.items()},
                               loop_bytes=step_cost.loop_bytes(text, traffic),
                               loop_flops=hlo_flops.matmul_flops(text) if step_cost.has_loops(text) else None,
                               on_chip_share=on_chip_share,
                               kernel_operand_bytes=traffic["undeclared_kernel_bytes"] if traffic else 0.0)


def _compile_note(r: dict[str, Any]) -> str:
  """What the compile time included, and the malloc it ran with (`malloc.reexec`)."""
  notes = [f"{r['lower_seconds']:.1f} s of it before XLA: setup, tracing, lowering"] if "lower_seconds" in r else []
  if "allocator" in r:
    notes.append(f"malloc: {'the C library' if r['allocator'] == 'system' else r['allocator']}")
  return f" ({'; '.join(notes)})" if notes else ""


def format_report(r: dict[str, Any]) -> str:
  """The human-readable part of `bert-jax aot`'s output."""
  m, t = r["memory_per_device"], r["time_per_step"]
  mesh = " x ".join(f"{axis} {size}" for axis, size in r["mesh"].items())
  lines = [
      f"{r['topology']}: {r['chips']} chips x {r['devices_per_chip']} device(s) = {r['devices']} "
      f"{r['device_kind']} devices; mesh {mesh}; batch {r['global_batch_size']} x {r['seq_length']} "
      f"in {r['micro_batches']} micro-batch(es); compiled in {r['compile_seconds']:.1f} s" + _compile_note(r),
  ]
  if t is None:   # the compiler stopped: out of memory
    needed = m["xla_error"]
    if m["temp_bytes"] is not None:
      needed = (f"temporaries alone need {m['temp_bytes'] / GiB:.2f} GiB of the "
                f"{m['available_hbm_bytes'] / GiB:.2f} GiB the compiler may use")
    lines += [f"memory per device: DOES NOT FIT: {needed} ({m['hbm_bytes'] / GiB:.0f} GiB HBM)",
              "  more micro_batches, or mesh.fsdp / mesh.tensor > 1, lower it"]
    return "\n".join(lines)
  gib = lambda b: f"{b / GiB:7.2f} GiB"   # noqa: E731
  lines += [
      "memory per device (XLA buffer assignment):",
      f"  arguments {gib(m['argument_bytes'])}  outputs {gib(m['output_bytes'])}  "
      f"donated {gib(m['alias_bytes'])}",
      f"  temporaries {gib(m['temp_bytes'])}  code {gib(m['generated_code_bytes'])}",
      f"  total {gib(m['total_bytes'])} of {gib(m['hbm_bytes'])} HBM ({100 * m['hbm_fraction']:.0f}%): "
      + ("fits" if m["fits"] else "DOES NOT FIT"),
  ] + _step_time_lines(r)
  if r.get("hlo_text_error"):
    lines.append(f"  the compiled step's HLO could not be read back ({r['hlo_text_error']}): XLA's count "
                 "alone (a loop body once, Pallas kernels that declare no cost as nothing), no bytes by "
                 "memory space, no --report or --hlo")
  if "traffic" in r:
    lines.append(hlo_bytes.format_summary(r["traffic"], t["xla_bytes_accessed"]))
  if "compile_passes" in r:
    lines.append(compile_passes_lib.format_summary(r["compile_passes"]) if "error" not in r["compile_passes"]
                 else f"compile time: no pass timings ({r['compile_passes']['error']})")
  return "\n".join(lines)


def _step_time_lines(r: dict[str, Any]) -> list[str]:
  """`format_report`'s estimated step time: compute, memory, the step and, where the step keeps arrays on
  chip, the same without their traffic."""
  t = r["time_per_step"]
  kernel_flops = kernel_bytes = loop_flops = ""
  if t.get("loop_flops"):
    loop_flops = f"; matmuls, loop bodies per trip, {t['loop_flops'] / 1e12:.2f}"
  if t.get("kernel_flops"):
    kernel_flops = f" + attention kernel {t['kernel_flops'] / 1e12:.2f}"
    kernel_bytes = f" + attention kernel's re-reads {t['kernel_bytes'] / 1e9:.2f} GB, estimated,"
  if t.get("kernel_operand_bytes") and t["bytes_source"] == "xla":
    kernel_bytes = (f": XLA's {t['xla_bytes_accessed'] * t['loop_factor'] / 1e9:.1f} + Pallas kernels' operands and "
                    f"results {t['kernel_operand_bytes'] * t['loop_factor'] / 1e9:.2f} by op, which XLA counts as "
                    f"moving nothing{kernel_bytes}")
  lines = [
      "estimated step time per device:",
      f"  compute {1e3 * t['compute_seconds']:.1f} ms ({t['model_flops'] / 1e12:.2f} model TFLOP, XLA "
      f"{t['xla_flops'] / 1e12:.2f} x{t['loop_factor']:.1f}{kernel_flops}"
      f"{loop_flops} at {t['peak_flops'] / 1e12:.1f} TFLOP/s)",
      f"  memory  {1e3 * t['memory_seconds']:.1f} ms ({t['step_bytes'] / 1e9:.1f} GB"
      f"{' by op, loop bodies per trip' if t['bytes_source'] == 'hlo_bytes' else ''}"
      f"{kernel_bytes} at {t['hbm_bandwidth'] / 1e9:.0f} GB/s)",
      f"  step    {1e3 * t['step_seconds']:.1f} ms ({t['bound']}-bound), {r['tokens_per_second']:,.0f} tokens/s, "
      f"MFU bound {100 * t['mfu_bound']:.0f}%",
  ]
  if t.get("on_chip_bytes"):
    lines += [
        f"  of the bytes, {100 * t['on_chip_share']:.0f}% ({t['on_chip_bytes'] / 1e9:.1f} GB) are in on-chip memory "
        f"(layouts S(n), counted by op); without them, {t['hbm_bytes'] / 1e9:.1f} GB of HBM traffic:",
        f"  HBM alone {1e3 * t['hbm_memory_seconds']:.1f} ms; step {1e3 * t['hbm_step_seconds']:.1f} ms "
        f"({t['hbm_bound']}-bound), MFU bound {100 * t['hbm_mfu_bound']:.0f}% if on-chip traffic were free "
        "(no faster than this)",
    ]
  return lines


FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command's flags, defined when the CLI runs it: importing `aot` (as the tests do) defines none."""
  config_flags.DEFINE_config_file("config", None, "Pretraining config file (configs/x.py[:arg]).")
  flags.DEFINE_string("topology", None, "TPU topology, e.g. v3:8x8, v4:4x4x4, v5e:8x8, v6e:8x8; "
                      "default: the config's `topology` field.")
  flags.DEFINE_bool("report", False, "Also list the compiled step's largest memory consumers: ops, "
                    "the JAX ops that made them and op kinds, by bytes read and written.")
  flags.DEFINE_integer("report_top", 15, "With --report: how many of each to list.")
  flags.DEFINE_bool("search_mesh", False, "Compile every (data, fsdp, tensor) split of the topology "
                    "that suits the config (or those of --mesh_candidates) and rank them by estimated "
                    "step time among those that fit.")
  flags.DEFINE_list("mesh_candidates", [], "With --search_mesh: only these meshes, each "
                    "DATAxFSDPxTENSOR, e.g. 16x4x1,8x4x2.")
  flags.DEFINE_string("hlo", None, "Also write the compiled step's optimized HLO text to this file "
                      "(to diff two versions, or to read with bert_jax.tools.hlo_bytes).")
  flags.DEFINE_string("json", None, "Also write the report as JSON to this file.")
  flags.DEFINE_bool("compile_passes", False, "Also say where XLA's compile time went: before, in and after "
                    "its HLO passes, and the passes and pipelines that took it (XLA's own pass timings).")


def topology_note(config, topology: str) -> str:
  """A note when compiling for a topology other than the config's own (the one its mesh, and its peak for
  training's MFU, were set for)."""
  sized_for = config.get("topology", "")
  if not sized_for or sized_for == topology:
    return ""
  return (f"note: the config's topology is {sized_for}, not {topology}: its mesh was set for that one "
          f"unless given here; --search_mesh ranks {topology}'s splits")


def main(argv) -> None:
  if len(argv) > 1:
    raise ValueError(f"unexpected arguments: {argv[1:]}")
  import jax  # pylint: disable=g-import-not-at-top
  # Compiling for a topology needs no accelerator: keep jax off the (absent) local TPU.
  if not os.environ.get("JAX_PLATFORMS"):
    jax.config.update("jax_platforms", "cpu")
  # A file that is not there, or another kind of config: one line, exit 2.
  config = config_loading.load_config(FLAGS["config"], "bert-jax aot", kind="pretrain")
  if config is None:
    raise failures.UserError("--config is required: the pretraining config whose train step to compile, e.g. "
                             "--config=configs/bert_large.py:phase1")
  topology = FLAGS.topology or config.get("topology", "")
  if not topology:
    raise failures.UserError("no --topology and the config has no `topology` field")
  with failures.as_user_errors("bert-jax aot", OSError):   # their folders before the compile, which takes minutes
    for name in ("hlo", "json"):
      if FLAGS[name].value:
        paths.output_file(FLAGS[name].value, name)
  if FLAGS.search_mesh:
    if FLAGS.report or FLAGS.hlo or FLAGS.compile_passes:
      raise failures.UserError("--report, --hlo and --compile_passes describe one compiled step: run them with "
                               "the mesh the search picks")
    from bert_jax.tools import mesh_search  # pylint: disable=g-import-not-at-top  (it compiles with `run`)
    candidates = [tuple(int(x) for x in c.split("x")) for c in FLAGS.mesh_candidates] or None
    ranked = mesh_search.search_mesh(config, topology, candidates)
    print(f"{topology}, meshes data x fsdp x tensor, best first:")
    print("\n".join(mesh_search.summary_line(r) for r in ranked))
    print(json.dumps(ranked))
    if FLAGS.json:
      with open(FLAGS.json, "w") as f:
        json.dump(ranked, f, indent=2)
    if not ranked[0]["memory_per_device"]["fits"]:
      sys.exit(1)
    return
  if note := topology_note(config, topology):
    print(note)
  report = run(config, topology, FLAGS.report_top if FLAGS.report else 0, FLAGS.hlo or "", FLAGS.compile_passes)
  print(format_report(report))
  print(json.dumps(report))
  if FLAGS.json:
    with open(FLAGS.json, "w") as f:
      json.dump(report, f, indent=2)
  if not report["memory_per_device"]["fits"]:
    sys.exit(1)

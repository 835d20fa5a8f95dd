"""What a compiled step costs on its device, from XLA's analyses: the buffer assignment against HBM
(`memory_report`, or `out_of_memory_report` when the TPU compiler stopped for lack of it) and the estimated
step time (`time_report`): the larger of compute (FLOPs at peak) and memory (bytes accessed at HBM
bandwidth), with each loop body counted per trip (`loop_bytes`). `bert-jax aot` (bert_jax/tools/aot.py)
reports them; its module docstring says what the estimate leaves out.
"""

import re
from typing import Any

from bert_jax.tpu_chips import Chip
from bert_jax.tools import hlo_bytes


# The TPU compiler's out-of-memory message: "... required for HLO temporaries (42.88G) exceeds available HBM
# (15.48G)"; sizes in binary units.
_HBM_OOM = re.compile(r"required for HLO temporaries \(([\d.]+)([KMGT]?)\) exceeds available HBM \(([\d.]+)([KMGT]?)\)")
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def out_of_memory_report(error: Exception, hbm_per_device: float) -> dict[str, Any] | None:
  """The memory part of the report when the TPU compiler stopped for lack of HBM, else None.

  The compiler then states the temporaries it needed and the HBM it had (less than the device's:
  the runtime keeps some); other buffers are not known.
  """
  text = str(error)
  if "RESOURCE_EXHAUSTED" not in text and "HbmOom" not in text:
    return None
  match = _HBM_OOM.search(text)
  size = lambda number, unit: float(number) * _UNITS[unit]   # noqa: E731
  return {"temp_bytes": size(*match.group(1, 2)) if match else None,
          "available_hbm_bytes": size(*match.group(3, 4)) if match else None,
          "hbm_bytes": hbm_per_device, "fits": False, "xla_error": text.strip().splitlines()[0]}


def memory_report(compiled, hbm_per_device: float) -> dict[str, float]:
  """Per-device bytes of XLA's buffer assignment; donated inputs (aliases) are counted once."""
  m = compiled.memory_analysis()
  report = {
      "argument_bytes": m.argument_size_in_bytes,
      "output_bytes": m.output_size_in_bytes,
      "alias_bytes": m.alias_size_in_bytes,
      "temp_bytes": m.temp_size_in_bytes,
      "generated_code_bytes": m.generated_code_size_in_bytes,
  }
  total = (m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
           + m.temp_size_in_bytes + m.generated_code_size_in_bytes)
  report.update(total_bytes=total, hbm_bytes=hbm_per_device, hbm_fraction=total / hbm_per_device,
                fits=total <= hbm_per_device)
  return report


def time_report(compiled, chip: Chip, model_flops_per_device: float, loop_trips: int = 1,
                kernel: dict | None = None, loop_bytes: float | None = None,
                on_chip_share: float | None = 0.0, loop_flops: float | None = None,
                kernel_operand_bytes: float = 0.0) -> dict[str, Any]:
  """Estimated step time per device: max(FLOPs / peak, bytes accessed / HBM bandwidth).

  `loop_trips` is how often the step runs its outermost loop (`micro_batches`), which XLA counts once.
  `kernel`: per device, what runs inside the attention kernels, which XLA's cost analysis does not see
  (`flops.kernel_attention_per_row`'s model FLOPs, FLOPs and the bytes they read beyond one read of each
  operand); added to its counts. `kernel_operand_bytes`: the operands and results, as stored, of the Pallas
  kernels that declare no cost (`hlo_bytes`' `undeclared_kernel_bytes`), which XLA counts as moving
  nothing; added to XLA's count (the count by op has them).
  `loop_bytes`: for a step with loops, the bytes its ops move with each loop body counted per trip
  (`loop_bytes()`); it replaces XLA's count, which counts them once (and is otherwise scaled as the FLOPs).
  `loop_flops`: for a step with loops, the FLOPs of its matmuls with each loop body counted per trip
  (`hlo_flops.matmul_flops`): the compute is charged these where they exceed XLA's count scaled by the loop
  factor (up to the model's FLOPs in a scanned stack, which leaves out a remat policy's recomputed matmuls).
  `on_chip_share`: the fraction of the step's bytes in on-chip memory spaces, by `hlo_bytes`' count (the
  same share of XLA's count is taken as on chip); the "hbm_" fields
  are the step without them (on-chip traffic free), the others charge them at HBM bandwidth. None when
  the compiled step's HLO could not be read: the "hbm_" fields are None too.
  """
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost   # older jax returned a list
  xla_flops, xla_bytes = float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))
  kernel = kernel or {"model_flops": 0.0, "flops": 0.0, "bytes": 0.0}
  kernel_flops, kernel_bytes = kernel["flops"], kernel["bytes"]
  # Loop bodies are counted once by XLA: scale by the trip count, and up to the analytic count (less the
  # kernel's share) when a loop inside (a scanned layer stack) leaves it short.
  visible = model_flops_per_device - kernel["model_flops"]
  loop_factor = max(float(loop_trips), visible / xla_flops if xla_flops else 1.0)
  peak, bandwidth = chip.peak_flops / chip.cores, chip.hbm_bandwidth / chip.cores
  step_flops = max(xla_flops * loop_factor, loop_flops or 0.0)
  compute_s = (step_flops + kernel_flops) / peak
  step_bytes = (xla_bytes + kernel_operand_bytes) * loop_factor if loop_bytes is None else loop_bytes
  memory_s = (step_bytes + kernel_bytes) / bandwidth
  step_s = max(compute_s, memory_s)
  report = {
      "xla_flops": xla_flops, "xla_bytes_accessed": xla_bytes, "step_bytes": step_bytes,
      "bytes_source": "xla" if loop_bytes is None else "hlo_bytes",
      # XLA's own estimate, when it has one (negative values, seen for v5e, mean none).
      "xla_optimal_seconds": optimal if (optimal := float(cost.get("optimal_seconds", -1.0))) > 0 else None,
      "model_flops": model_flops_per_device, "loop_factor": loop_factor, "loop_flops": loop_flops,
      "step_flops": step_flops,
      "kernel_flops": kernel_flops, "kernel_bytes": kernel_bytes, "kernel_operand_bytes": kernel_operand_bytes,
      "peak_flops": peak, "hbm_bandwidth": bandwidth,
      "compute_seconds": compute_s, "memory_seconds": memory_s, "step_seconds": step_s,
      "bound": "compute" if compute_s >= memory_s else "memory",
      "mfu_bound": model_flops_per_device / peak / step_s if step_s else 0.0,
  }
  return {**report, **_on_chip_free(report, on_chip_share)}


def _on_chip_free(report: dict, on_chip_share: float | None) -> dict[str, Any]:
  """`time_report`'s "on_chip_" and "hbm_" fields: the step of `report` with the share of its bytes in on-chip
  memory moving for free (the kernels' extra reads stay in HBM); None each where the share is not known."""
  if on_chip_share is None:
    return dict.fromkeys(("on_chip_share", "on_chip_bytes", "hbm_bytes", "hbm_memory_seconds",
                          "hbm_step_seconds", "hbm_bound", "hbm_mfu_bound"))
  compute_s, bandwidth = report["compute_seconds"], report["hbm_bandwidth"]
  on_chip_bytes = report["step_bytes"] * on_chip_share
  hbm_bytes = report["step_bytes"] - on_chip_bytes + report["kernel_bytes"]
  hbm_step_s = max(compute_s, hbm_bytes / bandwidth)
  return {
      "on_chip_share": on_chip_share, "on_chip_bytes": on_chip_bytes, "hbm_bytes": hbm_bytes,
      "hbm_memory_seconds": hbm_bytes / bandwidth,
      "hbm_step_seconds": hbm_step_s, "hbm_bound": "compute" if compute_s >= hbm_bytes / bandwidth else "memory",
      "hbm_mfu_bound": report["model_flops"] / report["peak_flops"] / hbm_step_s if hbm_step_s else 0.0,
  }


def loop_bytes(hlo_text: str, summary: dict | None = None) -> float | None:
  """The bytes a step with loops moves, each body counted per trip (`hlo_bytes`; `summary`: its summary of
  this text, when already made); None without loops, or with a loop whose trip count the HLO does not give
  (then XLA's count, scaled as the FLOPs are, stands)."""
  if not has_loops(hlo_text):
    return None
  summary = summary or hlo_bytes.summarize(hlo_bytes.traffic(hlo_text), 0)
  return None if summary["unknown_loops"] else summary["total_bytes"]


_WHILE = re.compile(r"\swhile\(%")


def has_loops(hlo_text: str) -> bool:
  """Whether an optimized HLO text runs a loop (whose body XLA's cost analysis counts once)."""
  return bool(_WHILE.search(hlo_text))

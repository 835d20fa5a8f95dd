"""Where a compile's time goes: XLA's HLO passes, timed by XLA itself, and the time around them.

`bert-jax aot --compile_passes` prints this for the step it compiled. XLA writes, for each module it
compiles with `xla_dump_module_metadata`, the start and end of every HLO pass it ran (pass and pipeline
names, wall-clock microseconds) to `module_NNNN.metadata.textproto` under `xla_dump_to`;
`xla_dump_hlo_module_re` matching no module name keeps it from writing the HLO itself. XLA's compile
(its wall-clock window, taken around `Lowered.compile`) splits in three: before the first timed pass,
from the first pass's start to the last one's end, and after the last (the TPU backend's work that is not
timed as an HLO pass: code generation among it).

A pass that runs a pipeline of its own (a fixed-point loop of simplifications, say) is timed as a whole
and so is each pass inside it; each pass here is given its exclusive time, less the passes nested in it,
so that the times add up to the time spent in passes.
"""

import collections
import dataclasses
import glob
import os
import re


def dump_options(directory: str) -> dict:
  """Compiler options (`Lowered.compile(compiler_options=...)`) that write the pass timings of the
  compiled module, and nothing else, under `directory`."""
  return {"xla_dump_to": directory, "xla_dump_module_metadata": True, "xla_dump_hlo_module_re": "^$"}


@dataclasses.dataclass(frozen=True)
class Pass:
  name: str
  pipeline: str
  start_us: int
  end_us: int


_RECORD = re.compile(r"^pass_metadata\s*\{\n(.*?)^\}", re.S | re.M)
# The record's own fields, two spaces in (a nested message's are further in).
_FIELD = re.compile(r'^  (pass_id|pass_name|pipeline_name|start_timestamp_usec|end_timestamp_usec):\s*'
                    r'(?:"((?:[^"\\]|\\.)*)"|(\S+))\s*$', re.M)
# Markers a pipeline logs at its ends, not passes.
_MARKERS = frozenset({"pipeline-start", "pipeline-end"})


def parse(text: str) -> list[Pass]:
  """The timed passes of a module metadata textproto, in the order they started (ties: the pass XLA
  started first, by `pass_id`); pipeline markers and passes without both timestamps left out."""
  out = []
  for record in _RECORD.findall(text):
    fields = {k: (quoted.encode().decode("unicode_escape") if quoted else bare)
              for k, quoted, bare in _FIELD.findall(record)}
    if fields.get("pass_name") in _MARKERS or not {"start_timestamp_usec", "end_timestamp_usec"} <= fields.keys():
      continue
    out.append((int(fields["start_timestamp_usec"]), int(fields.get("pass_id", 0)),
                Pass(fields.get("pass_name", ""), fields.get("pipeline_name", ""),
                     int(fields["start_timestamp_usec"]), int(fields["end_timestamp_usec"]))))
  return [p for _, _, p in sorted(out, key=lambda t: t[:2])]


def read(directory: str) -> list[Pass]:
  """The passes `dump_options(directory)` had XLA time there: of the module with the most timed passes,
  where XLA wrote more than one module's (a module's pre-partitioning metadata has its own file)."""
  files = sorted(glob.glob(os.path.join(directory, "*.metadata.textproto")))
  if not files:
    raise ValueError(f"no pass timings in {directory}: no pass ran (a compile cache's hit?)")
  modules = []
  for name in files:
    with open(name) as f:
      modules.append(parse(f.read()))
  return max(modules, key=len)


def exclusive_seconds(passes: list[Pass]) -> list[float]:
  """Each pass's seconds less those of the passes that ran inside it (start and end within its own);
  passes that overlap without nesting are refused (ValueError).
  Of two passes with the same start and end, the one listed first is taken as the outer one (`parse`
  lists them as XLA started them)."""
  order = sorted(range(len(passes)), key=lambda i: (passes[i].start_us, -passes[i].end_us))   # stable
  own = [(p.end_us - p.start_us) / 1e6 for p in passes]
  stack: list[int] = []   # the passes enclosing the current one, innermost last
  for i in order:
    while stack and passes[stack[-1]].end_us <= passes[i].start_us and passes[stack[-1]].end_us < passes[i].end_us:
      stack.pop()
    if stack and passes[i].end_us > passes[stack[-1]].end_us:
      raise ValueError(f"passes that overlap without one nested in the other: {passes[stack[-1]].name!r} "
                       f"and {passes[i].name!r}; their times cannot be split")
    if stack:
      own[stack[-1]] -= (passes[i].end_us - passes[i].start_us) / 1e6
    stack.append(i)
  return own


def summarize(passes: list[Pass], compile_start: float, compile_end: float, top: int = 12) -> dict:
  """The compile's window (`time.time()` at its start and end) split around the passes, and the passes'
  exclusive seconds by pipeline and by pass, the `top` of each."""
  if not passes:
    raise ValueError("no timed passes")
  first = min(p.start_us for p in passes) / 1e6
  last = max(p.end_us for p in passes) / 1e6
  own = exclusive_seconds(passes)
  by_pass, by_pipeline = collections.Counter(), collections.Counter()
  for p, s in zip(passes, own):
    by_pass[p.name] += s
    by_pipeline[p.pipeline] += s
  return {
      "compile_seconds": compile_end - compile_start,
      "before_passes_seconds": first - compile_start,
      "passes_seconds": last - first,
      "in_passes_seconds": sum(own),
      "after_passes_seconds": compile_end - last,
      "passes": len(passes),
      "by_pipeline": [{"pipeline": k, "seconds": v} for k, v in by_pipeline.most_common(top)],
      "by_pass": [{"pass": k, "seconds": v} for k, v in by_pass.most_common(top)],
  }


def format_summary(s: dict) -> str:
  """The text `bert-jax aot --compile_passes` prints."""
  lines = [
      f"compile time (XLA's, this machine): {s['compile_seconds']:.1f} s: {s['before_passes_seconds']:.1f} s "
      f"before the first timed HLO pass, {s['passes_seconds']:.1f} s from the first to the last "
      f"({s['in_passes_seconds']:.1f} s of it in the {s['passes']} passes, nested ones counted once), "
      f"{s['after_passes_seconds']:.1f} s after the last (the backend's work that XLA does not time as passes)",
      "  HLO passes by pipeline (exclusive seconds):",
  ]
  lines += [f"    {r['seconds']:7.2f} s  {r['pipeline']}" for r in s["by_pipeline"]]
  lines.append("  by pass:")
  lines += [f"    {r['seconds']:7.2f} s  {r['pass']}" for r in s["by_pass"]]
  return "\n".join(lines)

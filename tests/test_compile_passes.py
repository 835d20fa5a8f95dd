"""Where a compile's time goes: XLA's pass timings read, nested passes counted once, and `aot --compile_passes`."""

import pytest

from bert_jax.tools import compile_passes
from test_aot import _aot, OVERRIDES


def _record(name, pipeline, start, end):
  return (f'pass_metadata {{\n  pass_id: 1\n  pass_name: "{name}"\n  pipeline_name: "{pipeline}"\n'
          f'  module_changed: true\n  start_timestamp_usec: {start}\n  end_timestamp_usec: {end}\n}}\n')


# A pipeline of three passes, the second running two passes of its own (nested in its window), then a
# marker, then a pass of another pipeline: times in microseconds from 1e6.
TEXT = "".join([
    _record("pipeline-start", "outer", 1_000_000, 1_000_000),
    _record("fusion", "outer", 1_000_000, 1_500_000),
    _record("simplify", "outer", 1_500_000, 2_500_000),
    _record("algsimp", "fixed-point", 1_600_000, 1_900_000),
    _record("dce", "fixed-point", 1_900_000, 2_000_000),
    _record("layout", "outer", 2_500_000, 2_600_000),
    _record("pipeline-end", "outer", 2_600_000, 2_600_000),
    _record("fusion", "late", 3_000_000, 3_250_000),
])


def test_parse_leaves_out_the_pipeline_markers_and_passes_not_timed_to_the_end():
  unfinished = _record("still-running", "outer", 2_600_000, 0).replace("  end_timestamp_usec: 0\n", "")
  nested_field = ('pass_metadata {\n  pass_id: 9\n  pass_name: "named \\"so\\""\n  pipeline_name: "p"\n'
                  '  custom {\n    pass_name: "inner"\n  }\n  start_timestamp_usec: 4000000\n'
                  '  end_timestamp_usec: 4000001\n}\n')
  passes = compile_passes.parse(TEXT + unfinished + nested_field)
  assert [p.name for p in passes] == ["fusion", "simplify", "algsimp", "dce", "layout", "fusion", 'named "so"']
  assert passes[1] == compile_passes.Pass("simplify", "outer", 1_500_000, 2_500_000)


def test_a_pass_that_runs_passes_of_its_own_keeps_only_its_own_time():
  passes = compile_passes.parse(TEXT)
  assert compile_passes.exclusive_seconds(passes) == pytest.approx([0.5, 0.6, 0.3, 0.1, 0.1, 0.25])
  # Three levels, an inner pass starting with its parent, another ending with it, listed out of order:
  # each loses only its direct children's windows.
  P = compile_passes.Pass   # noqa: N806
  deep = [P("d", "x", 3, 4), P("a", "x", 0, 10_000_000), P("b", "x", 0, 9_000_000), P("c", "x", 2_000_000, 9_000_000),
          P("e", "x", 10_000_000, 11_000_000)]
  assert compile_passes.exclusive_seconds(deep) == pytest.approx([1e-6, 1.0, 2.0, 7.0 - 1e-6, 1.0])
  # The same window twice: the one listed first (XLA started it first) holds the other.
  assert compile_passes.exclusive_seconds([P("outer", "x", 0, 5), P("inner", "x", 0, 5)]) == pytest.approx([0, 5e-6])


def test_passes_that_overlap_without_nesting_are_refused():
  P = compile_passes.Pass   # noqa: N806
  with pytest.raises(ValueError, match="overlap"):
    compile_passes.summarize([P("a", "x", 0, 2_000_000), P("b", "x", 1_000_000, 3_000_000),
                              P("c", "x", 1_500_000, 2_900_000)], 0.0, 3.0)


def test_summary_splits_the_compile_around_the_passes_and_ranks_them():
  s = compile_passes.summarize(compile_passes.parse(TEXT), compile_start=0.5, compile_end=4.0, top=2)
  assert s["compile_seconds"] == pytest.approx(3.5)
  assert s["before_passes_seconds"] == pytest.approx(0.5)
  assert s["passes_seconds"] == pytest.approx(2.25)   # first start to last end, gaps included
  assert s["in_passes_seconds"] == pytest.approx(1.85)   # nested passes counted once
  assert s["after_passes_seconds"] == pytest.approx(0.75)
  assert s["by_pass"] == [{"pass": "fusion", "seconds": pytest.approx(0.75)},
                          {"pass": "simplify", "seconds": pytest.approx(0.6)}]
  assert s["by_pipeline"][0] == {"pipeline": "outer", "seconds": pytest.approx(1.2)}
  text = compile_passes.format_summary(s)
  assert "0.5 s before the first timed HLO pass" in text and "2.2 s from the first to the last" in text
  assert "(1.9 s of it in the 6 passes" in text and "  fusion" in text


def test_read_takes_the_module_with_the_most_passes(tmp_path):
  with pytest.raises(ValueError, match="no pass ran"):
    compile_passes.read(str(tmp_path))
  (tmp_path / "module_0000.metadata.textproto").write_text(TEXT)
  assert len(compile_passes.read(str(tmp_path))) == 6
  (tmp_path / "module_0001.metadata.textproto").write_text(_record("dce", "pre", 1, 2))
  assert len(compile_passes.read(str(tmp_path))) == 6


@pytest.mark.slow
def test_aot_says_where_the_compile_time_went(tmp_path):
  proc, report = _aot(tmp_path, OVERRIDES, ["--compile_passes"])
  assert proc.returncode == 0, proc.stderr[-3000:]
  s = report["compile_passes"]
  # XLA's own compile, the lowering before it left out, is split into before, in and after the passes.
  assert 0 < s["compile_seconds"] <= report["compile_seconds"] - report["lower_seconds"]
  # XLA's timestamps fall inside the window timed around the compile: the same clock.
  assert s["before_passes_seconds"] >= 0 and s["after_passes_seconds"] >= 0 and s["passes_seconds"] > 0
  parts = s["before_passes_seconds"] + s["passes_seconds"] + s["after_passes_seconds"]
  assert parts == pytest.approx(s["compile_seconds"])
  assert s["passes"] > 100 and 0 < s["in_passes_seconds"] <= s["passes_seconds"] + 1e-6
  assert any(r["pass"] == "tpu_fusion" for r in s["by_pass"])   # the TPU compiler's passes, by name
  assert "HLO passes by pipeline" in proc.stdout

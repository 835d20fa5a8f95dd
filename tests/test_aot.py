"""`bert-jax aot` compiles the real train step for a small TPU topology (v4:2x2x1, megacore) here.

Run as the CLI in a subprocess: that is the command users run, and libtpu stays out of this process.
"""

import json
import math
import os
import re
import subprocess
import sys

import jax
import pytest

from bert_jax import malloc, objectives, sharding, tpu_chips, train_setup
from bert_jax.tools import hlo_bytes
from bert_jax.tools import step_cost
from conftest import REPO_ROOT
from conftest import assert_one_line_errors
from configs import tiny

# A one-layer tiny model (the TPU compiler takes tens of seconds even for this) whose matrices are
# multiples of the TPU's 128-wide tiles, so that memory is not dominated by layout padding.
OVERRIDES = {"model.vocab_size": 256, "model.hidden_size": 128, "model.num_layers": 1, "model.num_heads": 1,
             "model.intermediate_size": 256, "model.max_position_embeddings": 32, "data.seq_length": 32,
             "data.max_predictions_per_seq": 5, "global_batch_size": 16, "mesh.data": 2, "mesh.fsdp": 2}


@pytest.mark.slow
def test_aot_counts_a_scanned_layer_stack_per_layer(tmp_path):
  """XLA's cost analysis counts a loop body once: a scanned stack's bytes are counted by op, each layer's
  trip included, and come out near the unrolled stack's by the same count."""
  layers = {**OVERRIDES, "model.num_layers": 4}
  proc, unrolled = _aot(tmp_path / "unrolled", {**layers, "model.scan_layers": False}, ["--report"])
  assert proc.returncode == 0, proc.stderr[-3000:]
  proc, scanned = _aot(tmp_path / "scanned", {**layers, "model.scan_layers": True}, ["--report"])
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "by op, loop bodies per trip" in proc.stdout
  u, s = unrolled["time_per_step"], scanned["time_per_step"]
  assert u["bytes_source"] == "xla" and u["step_bytes"] == u["xla_bytes_accessed"]
  assert s["bytes_source"] == "hlo_bytes" and s["step_bytes"] == scanned["traffic"]["total_bytes"]
  assert 0.7 <= s["step_bytes"] / unrolled["traffic"]["total_bytes"] <= 1.5
  assert max(r["trips"] for r in scanned["traffic"]["top_ops"]) == 4
  assert s["memory_seconds"] == pytest.approx(s["step_bytes"] / s["hbm_bandwidth"])
  assert s["model_flops"] == u["model_flops"]
  # Unrolled over the stacked params (`scan_unroll`): no loop, so XLA's own count, near the unrolled stack's.
  proc, flat = _aot(tmp_path / "flat", {**layers, "model.scan_layers": True, "model.scan_unroll": 4}, ["--report"])
  assert proc.returncode == 0, proc.stderr[-3000:]
  f = flat["time_per_step"]
  assert f["bytes_source"] == "xla" and f["loop_flops"] is None
  assert max(r["trips"] for r in flat["traffic"]["top_ops"]) == 1
  assert 0.9 <= f["step_bytes"] / u["step_bytes"] <= 1.2
  # The matmuls, each trip counted, are the model's FLOPs; recomputed in the backward pass (remat "full"),
  # a third more, which the compute is charged (scaling XLA's count to the model's left them out).
  assert u["loop_flops"] is None and s["loop_flops"] == pytest.approx(s["model_flops"], rel=0.02)
  proc, remat = _aot(tmp_path / "remat", {**layers, "model.scan_layers": True, "model.remat_policy": "full"}, [])
  assert proc.returncode == 0, proc.stderr[-3000:]
  r = remat["time_per_step"]
  assert 1.15 * r["model_flops"] < r["loop_flops"] == r["step_flops"] < 1.5 * r["model_flops"]
  assert r["compute_seconds"] == pytest.approx(r["loop_flops"] / r["peak_flops"])


# A non-BERT objective: SpanBERT brings its own batch fields (span boundaries) and head (SBO).
SPANBERT = {"objective": "spanbert", "data.format": "doc_sentences", "data.span_masking": True}


# Two networks: a frozen teacher (a preset, as no checkpoint is read at compile time) beside the student.
DISTILBERT = {"objective": "distilbert", "data.format": "full_sentences", "model.type_vocab_size": 0,
              "distill.teacher_preset": "L-2_H-128_A-1"}


def _config(overrides=None):
  c = tiny.get_config()
  for key, value in (OVERRIDES if overrides is None else overrides).items():
    section, _, name = key.rpartition(".")
    (c[section] if section else c)[name] = value
  return c


@pytest.mark.slow
def test_aot_report_for_a_small_topology(tmp_path):
  out = tmp_path / "report.json"
  # --hlo and --json into folders that are not there yet: made before the compile, not lost after it.
  cmd = [sys.executable, "-m", "bert_jax.cli", "aot", "--config=configs/tiny.py", "--topology=v4:2x2x1",
         f"--json={out}", "--report", "--report_top=8", f"--hlo={tmp_path / 'hlo' / 'step.hlo'}"]
  cmd += [f"--config.{k}={v}" for k, v in OVERRIDES.items()]
  drop = ("XLA_FLAGS", malloc.VARIABLE, malloc._MARK, "LD_PRELOAD")   # the malloc as a user's shell would have it
  env = {k: v for k, v in os.environ.items() if k not in drop}
  proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "fits" in proc.stdout and "estimated step time" in proc.stdout and "memory traffic by op" in proc.stdout
  report = json.loads(out.read_text())
  assert report["device_kind"] == "TPU v4" and report["devices"] == report["chips"] == 4
  assert 0 < report["lower_seconds"] < report["compile_seconds"] and "before XLA" in proc.stdout
  # The compile ran with the first faster malloc installed (malloc.reexec), and says so.
  linux = sys.platform.startswith("linux")
  installed = [name for name in malloc.COMMANDS["aot"] if linux and malloc.ALLOCATORS[name][0]() is not None]
  installed.append("system")
  assert report["allocator"] == installed[0] and f"malloc: {report['allocator']}".replace(
      "malloc: system", "malloc: the C library") in proc.stdout

  memory = report["memory_per_device"]
  assert memory["hbm_bytes"] == 32 * 2**30 and memory["fits"]
  assert memory["total_bytes"] == (memory["argument_bytes"] + memory["output_bytes"] - memory["alias_bytes"]
                                   + memory["temp_bytes"] + memory["generated_code_bytes"])
  # Arguments: this device's shard of the train state and of the batch (TPU layouts pad small arrays).
  config = _config()
  s = train_setup.setup(config, sharding.create_mesh(config.mesh, devices=jax.devices()[:4]))
  state = sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
              for x in jax.tree.leaves(s.abstract_state))
  batch = sum(math.prod(x.shape) * x.dtype.itemsize for x in train_setup.abstract_batch(config).values()) / 4
  assert state + batch <= memory["argument_bytes"] <= 1.5 * (state + batch)
  assert memory["alias_bytes"] >= state   # the donated state is updated in place

  timing = report["time_per_step"]
  assert timing["model_flops"] == pytest.approx(objectives.train_flops_per_step(config) / 4)
  # XLA counts elementwise work too; tiny matrices make it a larger share than in BERT-base/large.
  assert 1.0 <= timing["xla_flops"] / timing["model_flops"] <= 2.0 and timing["loop_factor"] == 1.0
  assert timing["peak_flops"] == 275e12 and timing["hbm_bandwidth"] == 1200e9
  assert timing["step_seconds"] == max(timing["compute_seconds"], timing["memory_seconds"]) > 0
  assert report["tokens_per_second"] == pytest.approx(16 * 32 / timing["step_seconds"])
  assert 0 < timing["mfu_bound"] <= 1

  # --report: the compiled step's ops by bytes moved. Their sum is of the order of XLA's own count (0.7 of
  # it for this model, both with the TPU's tile padding; within 1.3% on BERT-large); fsdp 2 gathers weights.
  traffic = report["traffic"]
  assert 0.3 <= traffic["total_bytes"] / timing["xla_bytes_accessed"] <= 1.5
  sizes = [r["bytes"] for r in traffic["top_ops"]]
  assert len(sizes) == 8 and sizes == sorted(sizes, reverse=True) and sizes[0] > 0
  assert sum(k["bytes"] for k in traffic["by_category"]) == pytest.approx(traffic["total_bytes"])
  assert any(k["category"] == "collective all-gather" for k in traffic["by_category"])
  assert any("BertForPreTraining" in s["source"] for s in traffic["top_sources"])
  # --hlo wrote the compiled step's text: the report reads the same from it.
  text = (tmp_path / "hlo" / "step.hlo").read_text()
  assert text.startswith("HloModule")
  assert " conditional(" not in text   # the non-finite guard is a select here, folded into the update
  assert hlo_bytes.summarize(hlo_bytes.traffic(text))["total_bytes"] == pytest.approx(traffic["total_bytes"])


def _aot(tmp_path, overrides, flags=(), env=None) -> tuple[subprocess.CompletedProcess, dict]:
  """`bert-jax aot` of the tiny config with `overrides` for v4:2x2x1 (or `flags`' topology), with `env` added
  to the environment: the process and its JSON report."""
  tmp_path.mkdir(parents=True, exist_ok=True)
  out = tmp_path / "report.json"
  cmd = [sys.executable, "-m", "bert_jax.cli", "aot", "--config=configs/tiny.py", "--topology=v4:2x2x1",
         f"--json={out}", *flags] + [f"--config.{k}={v}" for k, v in overrides.items()]
  env = {**{k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}, **(env or {})}
  proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
  return proc, (json.loads(out.read_text()) if out.exists() else {})


@pytest.mark.slow
def test_aot_compiles_a_non_bert_objective(tmp_path):
  proc, report = _aot(tmp_path, {**OVERRIDES, **SPANBERT})
  assert proc.returncode == 0, proc.stderr[-3000:]
  memory, timing = report["memory_per_device"], report["time_per_step"]
  assert memory["fits"] and report["mesh"] == {"data": 2, "fsdp": 2, "tensor": 1}
  # The compiled step takes SpanBERT's batch (three span fields more than BERT's) beside the state.
  config = _config({**OVERRIDES, **SPANBERT})
  s = train_setup.setup(config, sharding.create_mesh(config.mesh, devices=jax.devices()[:4]))
  state = sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
              for x in jax.tree.leaves(s.abstract_state))
  batch = sum(math.prod(x.shape) * x.dtype.itemsize for x in train_setup.abstract_batch(config).values()) / 4
  assert state + batch <= memory["argument_bytes"] <= 1.5 * (state + batch)
  # Its FLOPs are the objective's own (the SBO head on top of BERT's without NSP).
  assert timing["model_flops"] == pytest.approx(objectives.train_flops_per_step(config) / 4)
  assert timing["model_flops"] > objectives.train_flops_per_step(_config()) / 4
  assert 1.0 <= timing["xla_flops"] / timing["model_flops"] <= 2.0 and timing["loop_factor"] == 1.0


@pytest.mark.slow
def test_aot_reports_a_step_that_does_not_fit(tmp_path):
  """The TPU compiler stops on a step that needs more HBM than a device has: a report, status 1."""
  rows = 2**22   # MLM logits alone: 2**20 rows x 5 predictions x 256 ids in f32 = 5 GiB per device
  proc, report = _aot(tmp_path, {**OVERRIDES, "global_batch_size": rows})
  assert proc.returncode == 1, proc.stderr[-3000:]
  assert "DOES NOT FIT" in proc.stdout
  memory = report["memory_per_device"]
  assert not memory["fits"] and report["time_per_step"] is None and report["tokens_per_second"] is None
  assert memory["available_hbm_bytes"] <= memory["hbm_bytes"] == 32 * 2**30 < memory["temp_bytes"]
  assert memory["temp_bytes"] >= rows / 4 * 5 * 256 * 4


@pytest.mark.slow
def test_aot_counts_the_frozen_teacher(tmp_path):
  """The compiled distillation step takes the teacher as an argument: its bytes are in the report."""
  proc, report = _aot(tmp_path, {**OVERRIDES, **DISTILBERT})
  assert proc.returncode == 0, proc.stderr[-3000:]
  memory = report["memory_per_device"]
  config = _config({**OVERRIDES, **DISTILBERT})
  s = train_setup.setup(config, sharding.create_mesh(config.mesh, devices=jax.devices()[:4]))
  per_device = lambda tree: sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize  # noqa: E731
                                for x in jax.tree.leaves(tree))
  state, teacher = per_device(s.abstract_state), per_device(s.frozen)
  assert teacher > 0.5 * per_device(s.abstract_state.params)   # a 2-layer teacher, a 1-layer student
  batch = sum(math.prod(x.shape) * x.dtype.itemsize for x in train_setup.abstract_batch(config).values()) / 4
  assert state + teacher + batch <= memory["argument_bytes"] <= 1.5 * (state + teacher + batch)
  assert report["time_per_step"]["model_flops"] == pytest.approx(objectives.train_flops_per_step(config) / 4)


# A tiny ModernBERT-style encoder: one global and one 32-token-window layer over 128 tokens, packed.
MODERNBERT_SPLASH = {**OVERRIDES, "objective": "modernbert", "data.format": "doc_sentences", "data.packing": True,
                     "model.type_vocab_size": 0, "model.num_layers": 2, "model.rope_theta": 10000.0,
                     "model.geglu": True, "model.pre_norm": True, "model.final_norm": True,
                     "model.norm_bias": False, "model.dense_bias": False, "model.global_attn_every_n_layers": 2,
                     "model.local_attention": 32, "model.max_position_embeddings": 128,
                     "model.attention_dropout": 0.0, "data.seq_length": 128, "data.max_predictions_per_seq": 20}


@pytest.mark.slow
def test_aot_compiles_the_splash_kernel(tmp_path):
  """With `attention_kernel=splash` the TPU step holds the Pallas kernel, and the report adds what XLA's
  cost analysis cannot see in it: the kernel's FLOPs (the window's only in the local layer) and bytes."""
  from bert_jax import flops  # pylint: disable=g-import-not-at-top
  overrides = {**MODERNBERT_SPLASH, "model.attention_kernel": "splash"}
  proc, report = _aot(tmp_path, overrides)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "+ attention kernel" in proc.stdout
  timing = report["time_per_step"]
  config = _config(overrides)
  kernel = flops.kernel_attention_per_row(objectives.encoder_config(config), 128)
  assert kernel["flops"] > 0 and kernel["bytes"] == 0   # one key block: no operand read twice
  assert timing["kernel_flops"] == pytest.approx(kernel["flops"] * 16 / 4)
  assert timing["kernel_bytes"] == pytest.approx(kernel["bytes"] * 16 / 4)
  # XLA counts the kernels (no declared cost) as moving nothing: their operands and results by op are added.
  assert timing["kernel_operand_bytes"] > 0.05 * timing["xla_bytes_accessed"]
  assert timing["step_bytes"] == timing["xla_bytes_accessed"] + timing["kernel_operand_bytes"]
  # XLA's count lacks the attention matmuls: with the kernel's model share it is about the model's.
  assert 1.0 <= (timing["xla_flops"] + kernel["model_flops"] * 16 / 4) / timing["model_flops"] <= 1.3
  assert timing["loop_factor"] == 1.0
  # Scanned, the bytes are counted by op, each trip, the kernels' operands among them: near the unrolled
  # step's. (A multi-line attribute of the kernel's custom call once ended the parse of its computation,
  # and the ops after it went uncounted.)
  proc, scanned = _aot(tmp_path / "scanned", {**overrides, "model.scan_layers": True}, ["--report"])
  assert proc.returncode == 0, proc.stderr[-3000:]
  s, traffic = scanned["time_per_step"], scanned["traffic"]
  assert s["bytes_source"] == "hlo_bytes" and s["step_bytes"] == traffic["total_bytes"]
  # The scanned layer picks its attention (global or windowed) in a conditional, both of whose branches the
  # count takes: the kernels' operands once or twice.
  assert 0.9 <= traffic["undeclared_kernel_bytes"] / timing["kernel_operand_bytes"] <= 2.1
  assert 0.7 <= s["step_bytes"] / timing["step_bytes"] <= 1.5


@pytest.mark.slow
def test_aot_compiles_the_flash_kernel_for_v3_in_one_mxu_pass(tmp_path):
  """With `attention_kernel=flash` the v3 step holds the Pallas kernels, the report adds the kernel's
  FLOPs, and the float32 operands v3's Mosaic takes compile to single-pass MXU matmuls (mode "round", as
  XLA's own bf16 matmuls on v3 are `vmatmul.f32`), not the six passes of full float32 precision."""
  from bert_jax import flops  # pylint: disable=g-import-not-at-top
  overrides = {**OVERRIDES, "model.attention_kernel": "flash", "model.attention_dropout": 0.1, "dtype": "bfloat16",
               "mesh.data": 4}
  dump = tmp_path / "mosaic"
  proc, report = _aot(tmp_path, overrides, ["--topology=v3:2x2"],
                      {"LIBTPU_INIT_ARGS": f"--xla_mosaic_dump_to={dump}"})
  assert proc.returncode == 0, proc.stderr[-3000:]
  timing, cfg = report["time_per_step"], objectives.encoder_config(_config(overrides))
  kernel = flops.kernel_attention_per_row(cfg, 32)
  assert timing["kernel_flops"] == pytest.approx(kernel["flops"] * 16 / 8) and kernel["flops"] > 0
  # Its operands and results, which XLA counts as moving nothing, by op: q, k, v, o forward and q, k, v,
  # do, dq, dk, dv backward at least ([2 rows, 32, 128] bf16 each on a device).
  assert timing["kernel_operand_bytes"] >= 11 * 2 * 32 * 128 * 2
  assert timing["step_bytes"] == timing["xla_bytes_accessed"] + timing["kernel_operand_bytes"]
  assert 1.0 <= (timing["xla_flops"] + kernel["model_flops"] * 16 / 8) / timing["model_flops"] <= 1.3
  llo = [p.read_text() for p in dump.glob("*post-finalize-llo.txt")]
  assert len(llo) >= 2                                   # forward and backward kernels
  modes = re.findall(r"matmul_mode<(\w+)>", "".join(llo))
  assert modes and set(modes) == {"round"}
  assert "matmul_data_format<f32>" in "".join(llo)


@pytest.mark.slow
def test_aot_compiles_electra_with_its_generator(tmp_path):
  """ELECTRA's step trains two networks: the generator's params and Adam moments are in the state the
  compiled step takes, and its FLOPs in the model count."""
  overrides = {**OVERRIDES, "objective": "electra", "data.format": "full_sentences"}
  proc, report = _aot(tmp_path, overrides)
  assert proc.returncode == 0, proc.stderr[-3000:]
  config = _config(overrides)
  s = train_setup.setup(config, sharding.create_mesh(config.mesh, devices=jax.devices()[:4]))
  assert "generator" in s.abstract_state.params
  state = sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
              for x in jax.tree.leaves(s.abstract_state))
  memory, timing = report["memory_per_device"], report["time_per_step"]
  assert memory["fits"] and state <= memory["argument_bytes"]
  assert timing["model_flops"] == pytest.approx(objectives.train_flops_per_step(config) / 4)
  assert timing["model_flops"] > objectives.train_flops_per_step(_config()) / 4   # the generator's too


@pytest.mark.slow
def test_time_before_xla_leaves_out_the_compiler(monkeypatch):
  import time   # pylint: disable=g-import-not-at-top
  from bert_jax.tools import aot   # pylint: disable=g-import-not-at-top
  compile_ = jax.stages.Lowered.compile

  def slow_compile(self, *args, **kwargs):
    time.sleep(1.0)
    return compile_(self, *args, **kwargs)

  monkeypatch.setattr(jax.stages.Lowered, "compile", slow_compile)
  config = _config()
  start = time.perf_counter()
  compiled, lower_s = aot.compile_train_step(config, jax.devices()[:4])
  assert compiled is not None and 0 < lower_s < time.perf_counter() - start - 1.0


def test_mesh_candidates_divide_the_batch_the_hidden_size_and_the_heads():
  from bert_jax.tools import mesh_search   # pylint: disable=g-import-not-at-top
  from configs import bert_large   # pylint: disable=g-import-not-at-top
  c = bert_large.get_config("phase1")   # 256 rows, hidden 1024, 16 heads, vocabulary 30522 = 2 x 15261
  found = mesh_search.mesh_candidates(c, 64)
  assert all(d * f * t == 64 for d, f, t in found) and len(set(found)) == len(found)
  assert {(64, 1, 1), (16, 4, 1), (1, 64, 1), (8, 4, 2), (1, 32, 2)} <= set(found)
  assert {t for _, _, t in found} == {1, 2}   # the vocabulary splits in two only
  # With the vocabulary off the tensor axis (its rules), tensor is bounded by the heads and the FFN alone.
  c.logical_axis_rules = tuple((name, None if name in ("vocab", "activation_vocab") else axes)
                               for name, axes in c.logical_axis_rules)
  assert {t for _, _, t in mesh_search.mesh_candidates(c, 64)} == {1, 2, 4, 8}
  c = bert_large.get_config("phase1")
  c.model.vocab_size = 32768
  found = mesh_search.mesh_candidates(c, 64)
  assert (1, 8, 8) in found and not [m for m in found if m[2] > 8]   # tensor at most 8
  c.global_batch_size, c.micro_batches = 32, 2   # 16 rows a micro-batch: data x fsdp divides 16
  assert all(16 % (d * f) == 0 for d, f, _ in mesh_search.mesh_candidates(c, 64))
  assert (8, 2, 4) in mesh_search.mesh_candidates(c, 64) and (16, 4, 1) not in mesh_search.mesh_candidates(c, 64)
  c.global_batch_size, c.micro_batches = 256, 1
  c.model.hidden_size, c.model.num_heads = 768, 12   # tensor divides the heads: 1, 2 or 4 of 64
  assert {t for _, _, t in mesh_search.mesh_candidates(c, 64)} == {1, 2, 4}
  # The meshes bert_large.py ships for each topology (v3:8x8's 128 cores, v5e's and v6e's 64) are
  # candidates there.
  for topology, phase in bert_large.MESHES:
    c = bert_large.get_config(f"{phase},{topology}")
    n = tpu_chips.device_count(topology)
    assert sharding.mesh_shape(c.mesh, n) in mesh_search.mesh_candidates(c, n), (topology, phase)
  # And bert_base.py's, on its v3:4x4 (32 cores).
  from configs import bert_base   # pylint: disable=g-import-not-at-top
  for phase, mesh in bert_base.MESHES.items():
    c = bert_base.get_config(phase)
    n = tpu_chips.device_count(c.topology)
    assert n == 32 and sharding.mesh_shape(c.mesh, n)[1:] == mesh[1:]
    assert sharding.mesh_shape(c.mesh, n) in mesh_search.mesh_candidates(c, n), phase


@pytest.mark.slow
def test_aot_search_mesh_ranks_the_splits_of_a_small_topology(tmp_path):
  out = tmp_path / "search.json"
  cmd = [sys.executable, "-m", "bert_jax.cli", "aot", "--config=configs/tiny.py", "--topology=v4:2x2x1",
         "--search_mesh", f"--json={out}"] + [f"--config.{k}={v}" for k, v in OVERRIDES.items()]
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  ranked = json.loads(out.read_text())
  # One head: no tensor split; 16 rows and width 128 divide over every data x fsdp split of 4 devices.
  assert sorted(tuple(r["mesh"].values()) for r in ranked) == [(1, 4, 1), (2, 2, 1), (4, 1, 1)]
  steps = [r["time_per_step"]["step_seconds"] for r in ranked]
  assert all(r["memory_per_device"]["fits"] for r in ranked) and steps == sorted(steps)
  assert "best first" in proc.stdout and proc.stdout.count("MFU bound") >= 6   # as compiled, then ranked


def test_search_mesh_refuses_malformed_meshes_and_says_when_none_is_left(monkeypatch):
  from bert_jax.tools import aot, mesh_search   # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(aot, "topology_devices", lambda topology: list(range(4)))

  def refuse(config, topology):
    raise RuntimeError("")   # no message: the log names the error's type

  monkeypatch.setattr(aot, "run", refuse)
  with pytest.raises(ValueError, match="not data x fsdp x tensor"):
    mesh_search.search_mesh(_config(), "v4:2x2x1", [(4, 1)])
  with pytest.raises(ValueError, match="not data x fsdp x tensor"):
    mesh_search.search_mesh(_config(), "v4:2x2x1", [(2, 1, 1)])
  logs = []
  with pytest.raises(ValueError, match="every mesh"):
    mesh_search.search_mesh(_config(), "v4:2x2x1", [(4, 1, 1)], log=logs.append)
  assert logs == ["  4x1x1: refused: RuntimeError"]


def test_search_mesh_breaks_ties_by_memory_time_and_clears_jax_caches_between_splits(monkeypatch):
  """Splits with equal step times: the one with the shorter memory time ranks first; a split that does
  not fit ranks last. Each split's compile is followed by jax.clear_caches and the heap handed back (a
  search of four BERT-base phase 2 splits grew to 15.9 GB with the caches cleared alone, one compile 7.5 GB)."""
  from bert_jax.tools import aot, mesh_search   # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(aot, "topology_devices", lambda topology: list(range(4)))
  times = {(4, 1, 1): (0.010, 0.009, True), (2, 2, 1): (0.010, 0.007, True), (1, 4, 1): (0.008, 0.008, False)}
  cleared = []
  monkeypatch.setattr(jax, "clear_caches", lambda: cleared.append(True))

  def run(config, topology):
    mesh = (config.mesh.data, config.mesh.fsdp, config.mesh.tensor)
    step, memory, fits = times[mesh]
    return {"mesh": dict(zip(("data", "fsdp", "tensor"), mesh)), "compile_seconds": 1.0,
            "memory_per_device": {"fits": fits, "total_bytes": 1.0},
            "time_per_step": {"step_seconds": step, "memory_seconds": memory, "compute_seconds": step,
                              "bound": "compute", "mfu_bound": 0.5}}

  monkeypatch.setattr(aot, "run", run)
  ranked = mesh_search.search_mesh(_config(), "v4:2x2x1", list(times), log=lambda line: None)
  assert [tuple(r["mesh"].values()) for r in ranked] == [(2, 2, 1), (4, 1, 1), (1, 4, 1)]
  assert len(cleared) == 3


def test_memory_time_counts_loop_bodies_per_trip_where_the_hlo_gives_the_trips():
  """`loop_bytes` (hlo_bytes, each loop body per trip) replaces XLA's bytes for a step with loops; without
  loops, or with a loop of unknown trip count, XLA's bytes stand, scaled as its FLOPs are."""
  from bert_jax.tools import aot   # pylint: disable=g-import-not-at-top
  from test_hlo_bytes import HLO, PARTIAL   # pylint: disable=g-import-not-at-top
  assert step_cost.loop_bytes(PARTIAL) is None   # no loop
  assert step_cost.loop_bytes(HLO) == hlo_bytes.summarize(hlo_bytes.traffic(HLO))["total_bytes"]
  unknown = HLO.replace(', backend_config={"known_trip_count":{"n":"3"}}', "").replace(
      "compare(%gte.2, %three)", "compare(%gte.2, %gte.2)")
  assert step_cost.loop_bytes(unknown) is None

  class Compiled:
    def cost_analysis(self):
      return {"flops": 1e12, "bytes accessed": 2e9}

  chip = aot.CHIPS["v4"]
  xla = step_cost.time_report(Compiled(), chip, model_flops_per_device=4e12)   # XLA saw a quarter of the FLOPs
  assert xla["loop_factor"] == 4 and xla["step_bytes"] == 8e9 and xla["bytes_source"] == "xla"
  ours = step_cost.time_report(Compiled(), chip, model_flops_per_device=4e12, loop_bytes=5e9)
  assert ours["step_bytes"] == 5e9 and ours["bytes_source"] == "hlo_bytes"
  assert ours["memory_seconds"] == pytest.approx(5e9 / (chip.hbm_bandwidth / chip.cores))
  assert ours["compute_seconds"] == xla["compute_seconds"]


def test_bytes_on_chip_give_a_second_bound_that_charges_only_hbm():
  """`on_chip_share` (of the bytes by op, those in on-chip memory spaces) leaves the step estimate as it
  was and gives the "hbm_" one: the same share of the step's bytes taken off, the rest at HBM bandwidth;
  the splash kernel's bytes stay in HBM."""
  from bert_jax.tools import aot   # pylint: disable=g-import-not-at-top

  class Compiled:
    def cost_analysis(self):
      return {"flops": 1e12, "bytes accessed": 16e9}

  chip = aot.CHIPS["v5e"]
  plain = step_cost.time_report(Compiled(), chip, model_flops_per_device=1e12)
  assert plain["on_chip_bytes"] == 0 and plain["hbm_bytes"] == 16e9 and plain["hbm_mfu_bound"] == plain["mfu_bound"]
  split = step_cost.time_report(Compiled(), chip, model_flops_per_device=1e12, on_chip_share=0.875)
  assert split["step_seconds"] == plain["step_seconds"] and split["mfu_bound"] == plain["mfu_bound"]
  assert split["on_chip_bytes"] == 14e9 and split["hbm_bytes"] == 2e9
  assert split["hbm_memory_seconds"] == pytest.approx(2e9 / 819e9)
  # 2 GB at 819 GB/s (2.4 ms) is under 1 TFLOP at 197 TFLOP/s (5.1 ms): compute-bound, MFU bound 100%.
  assert split["hbm_bound"] == "compute" and split["hbm_mfu_bound"] == pytest.approx(1.0)
  assert plain["bound"] == "memory" and plain["mfu_bound"] == pytest.approx(5.08 / 19.5, rel=0.01)
  # A step with loops: the share is of our own count, which replaces XLA's.
  looped = step_cost.time_report(Compiled(), chip, model_flops_per_device=1e12, loop_bytes=10e9, on_chip_share=0.5)
  assert looped["step_bytes"] == 10e9 and looped["hbm_bytes"] == 5e9
  kernel = {"model_flops": 0.0, "flops": 0.0, "bytes": 1e9}
  with_kernel = step_cost.time_report(Compiled(), chip, model_flops_per_device=1e12, kernel=kernel, on_chip_share=0.875)
  assert with_kernel["hbm_bytes"] == pytest.approx(3e9)


@pytest.mark.slow
def test_aot_tells_on_chip_bytes_from_hbm_bytes_on_v5e(tmp_path):
  """v5e's compiler keeps most arrays in its VMEM (S(1)): the report gives the step both ways."""
  proc, report = _aot(tmp_path, OVERRIDES, ["--topology=v5e:2x2", "--report"])
  assert proc.returncode == 0, proc.stderr[-3000:]
  t, traffic = report["time_per_step"], report["traffic"]
  assert report["device_kind"].startswith("TPU v5") and t["hbm_bandwidth"] == 819e9
  assert 0.1 < t["on_chip_share"] == traffic["on_chip_bytes"] / traffic["total_bytes"] < 1
  assert t["hbm_step_seconds"] <= t["step_seconds"] and t["hbm_mfu_bound"] >= t["mfu_bound"]
  assert "if on-chip traffic were free" in proc.stdout and "in on-chip memory" in proc.stdout
  # The same step for v4 keeps most of its arrays in S(3) (its CMEM, as we read it; 89% of the bytes by op
  # on 2026-12-03), a smaller share than v5e's VMEM.
  proc, report = _aot(tmp_path / "v4", OVERRIDES, ["--report"])
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert report["time_per_step"]["on_chip_share"] < t["on_chip_share"]


def test_aot_notes_a_topology_the_mesh_was_not_chosen_for():
  from bert_jax.tools import aot   # pylint: disable=g-import-not-at-top
  from configs import bert_large   # pylint: disable=g-import-not-at-top
  note = aot.topology_note(bert_large.get_config("phase2"), "v5e:8x8")
  assert "topology is v3:8x8, not v5e:8x8" in note and "--search_mesh ranks v5e:8x8's splits" in note
  assert aot.topology_note(bert_large.get_config("phase2,v5e:8x8"), "v5e:8x8") == ""
  assert aot.topology_note(tiny.get_config(), "v4:2x2x1") == ""   # no topology of its own


def test_topologies_libtpu_would_crash_on_are_refused_first():
  from bert_jax import failures   # pylint: disable=g-import-not-at-top
  from bert_jax.tools import aot   # pylint: disable=g-import-not-at-top
  assert aot.parse_topology("v4:4x4x4")[2] == "4x4x4" and aot.parse_topology("v3:2x2")[2] == "2x2"
  for shape in ("0x2", "axb", "8", "2x2x2x2", "-2x2", "2x"):   # 0x2 ends libtpu's process (a floating-point exception)
    with pytest.raises(failures.UserError, match=rf"topology 'v3:{shape}': its shape is chips along each axis"):
      aot.parse_topology(f"v3:{shape}")


@pytest.mark.slow
def test_aot_mistakes_are_one_line_before_any_compile(tmp_path):
  """No --config, a slice libtpu has no layout for, and an output that is a folder: exit 2, one line."""
  (tmp_path / "out").mkdir()
  tiny_config = str(REPO_ROOT / "configs" / "tiny.py")
  assert_one_line_errors(["aot"], {
      ("--topology=v3:2x2",): "bert-jax aot: --config is required",
      (f"--config={tiny_config}", "--topology=v3:3x3"): "bert-jax aot: topology 'v3:3x3': libtpu has no such slice",
      (f"--config={tiny_config}", "--topology=v3:2x2", "--hlo=out"): "bert-jax aot: --hlo=out is a folder",
      (f"--config={tiny_config}", "--topology=v3:2x2", "--json=out"): "bert-jax aot: --json=out is a folder",
  }, cwd=tmp_path)


def test_aot_without_libtpu_says_how_to_install_it(monkeypatch):
  import importlib.util   # pylint: disable=g-import-not-at-top
  from bert_jax import failures   # pylint: disable=g-import-not-at-top
  from bert_jax.tools import aot   # pylint: disable=g-import-not-at-top
  find_spec = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "libtpu" else find_spec(name, *a))
  monkeypatch.delenv("TPU_LIBRARY_PATH", raising=False)   # JAX sets it once it has loaded libtpu in this process
  with pytest.raises(failures.UserError, match=r"v4:2x2x1 needs libtpu.*pip install libtpu"):
    aot.topology_devices("v4:2x2x1")


@pytest.mark.slow
@pytest.mark.parametrize("reshard_after_forward", [False, True])
def test_attention_kernels_are_gathered_and_reduced_as_unpadded_matrices(tmp_path, reshard_after_forward):
  """A TPU stores an array in (8, 128) tiles of its two minor dims: a gathered [H, N, K] kernel with K = 64
  minor is padded to twice its bytes. The attention projections gather, multiply and reduce-scatter the
  gradient of their kernels as [H, N * K] and [N * K, H] matrices (`projections.Einsum`, `fsdp_gather`), gathered
  by us or by XLA: no array of the whole 3-D kernel's shape is left in the compiled step."""
  overrides = {**OVERRIDES, "model.num_heads": 2, "dtype": "bfloat16",
               "model.reshard_after_forward": reshard_after_forward}
  proc, _ = _aot(tmp_path, overrides, [f"--hlo={tmp_path / 'step.hlo'}"])
  assert proc.returncode == 0, proc.stderr[-3000:]
  text = (tmp_path / "step.hlo").read_text()
  assert re.search(r"\bbf16\[128,128\]", text)                     # the gathered matrices
  assert not re.search(r"\[128,2,64\]|\[2,64,128\]", text), re.findall(r".*\[(?:128,2,64|2,64,128)\].*", text)[:3]


@pytest.mark.slow
def test_the_masked_positions_stay_on_their_batch_shards(tmp_path):
  """The MLM head's input, the sequence output at the masked positions, is sharded over the batch as the
  sequence output is (`heads.gather_positions`). Left to the partitioner, with the batch over 4 fsdp shards
  here (v5e:8x8's 2 x 32 for BERT-large phase 1), it gathered the whole batch's [B, P, H] array and built
  its gradient as an all-reduce of it."""
  overrides = {**OVERRIDES, "mesh.data": 1, "mesh.fsdp": 4}
  proc, _ = _aot(tmp_path, overrides, [f"--hlo={tmp_path / 'step.hlo'}"])
  assert proc.returncode == 0, proc.stderr[-3000:]
  text = (tmp_path / "step.hlo").read_text()
  batch, positions, hidden = (overrides[k] for k in ("global_batch_size", "data.max_predictions_per_seq",
                                                      "model.hidden_size"))
  assert not re.search(rf"\[{batch},{positions},{hidden}\]", text), \
      re.findall(rf".*\[{batch},{positions},{hidden}\].*", text)[:2]


def test_a_step_whose_hlo_cannot_be_read_back_keeps_xlas_count_and_says_what_it_lacks():
  """libtpu compiles some steps whose optimized HLO it then fails to print (`hlo_text`): the report keeps
  XLA's count, has no bound with on-chip traffic free, and says why in its text and in a search's line."""
  from bert_jax.tools import aot, mesh_search   # pylint: disable=g-import-not-at-top

  class Compiled:
    def __init__(self, fails):
      self.fails = fails

    def cost_analysis(self):
      return {"flops": 1e12, "bytes accessed": 16e9}

    def as_text(self):
      if self.fails:
        raise RuntimeError("INTERNAL: RET_CHECK failure (hlo_instruction.cc:390) async-update\nmore lines")
      return "HloModule m"

  assert aot.hlo_text(Compiled(False)) == ("HloModule m", None)
  assert aot.hlo_text(Compiled(True)) == ("", "INTERNAL: RET_CHECK failure (hlo_instruction.cc:390) async-update")
  chip = aot.CHIPS["v5e"]
  known = step_cost.time_report(Compiled(True), chip, model_flops_per_device=1e12, on_chip_share=0.5)
  unknown = step_cost.time_report(Compiled(True), chip, model_flops_per_device=1e12, on_chip_share=None)
  assert unknown["step_seconds"] == known["step_seconds"] and unknown["mfu_bound"] == known["mfu_bound"]
  assert unknown["hbm_mfu_bound"] is unknown["on_chip_bytes"] is unknown["hbm_bytes"] is None
  report = {"topology": "v5e:8x8", "chips": 64, "devices_per_chip": 1, "devices": 64, "device_kind": "TPU v5 lite",
            "mesh": {"data": 2, "fsdp": 32, "tensor": 1}, "global_batch_size": 256, "seq_length": 128,
            "micro_batches": 1, "compile_seconds": 90.0, "tokens_per_second": 1.0, "time_per_step": unknown,
            "memory_per_device": {"argument_bytes": 0, "output_bytes": 0, "alias_bytes": 0, "temp_bytes": 0,
                                  "generated_code_bytes": 0, "total_bytes": 2**30, "hbm_bytes": 16 * 2**30,
                                  "hbm_fraction": 1 / 16, "fits": True},
            "hlo_text_error": aot.hlo_text(Compiled(True))[1]}
  text = aot.format_report(report)
  assert "HLO could not be read back (INTERNAL: RET_CHECK" in text and "XLA's count alone" in text
  assert "on-chip" not in text and "HBM alone" not in mesh_search.summary_line(report)
  assert "HBM alone" in mesh_search.summary_line({**report, "time_per_step": known})

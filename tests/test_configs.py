"""Every config under configs/ builds its abstract (sharded) train state; the paper numbers hold;
command-line overrides work and bad configs stop with a clear message before compiling."""

import glob
import math
import os

import jax
import pytest
from absl import flags
from ml_collections import config_flags

from bert_jax import optimizer
from bert_jax import sharding
from bert_jax import tpu_chips
from bert_jax import train
from bert_jax import train_setup
from bert_jax.objectives import electra
from configs import albert_base, albert_large, albert_xlarge, albert_xxlarge
from configs import distilbert_base, distilbert_minilm
from configs import electra_base, electra_large, electra_small
from configs import bert_base, bert_large, ltr_base, roberta_base, roberta_large, spanbert_base, spanbert_large, tiny
from configs import modernbert_base, modernbert_large

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = {
    "bert_base.py:phase1": bert_base.get_config("phase1"),
    "bert_base.py:phase1_tokens": bert_base.get_config("phase1_tokens"),
    "bert_base.py:phase2": bert_base.get_config("phase2"),
    "bert_large.py:phase1": bert_large.get_config("phase1"),
    "bert_large.py:phase1_tokens": bert_large.get_config("phase1_tokens"),
    "bert_large.py:phase2": bert_large.get_config("phase2"),
    **{f"bert_large.py:{phase},{topology}": bert_large.get_config(f"{phase},{topology}")
       for topology, phase in bert_large.MESHES if topology != bert_large.PAPER_TOPOLOGY},
    "albert_base.py": albert_base.get_config(),
    "albert_large.py": albert_large.get_config(),
    "albert_xlarge.py": albert_xlarge.get_config(),
    "albert_xxlarge.py": albert_xxlarge.get_config(),
    "ltr_base.py:phase1": ltr_base.get_config("phase1"),
    "spanbert_base.py": spanbert_base.get_config(),
    "spanbert_large.py": spanbert_large.get_config(),
    "roberta_base.py": roberta_base.get_config(),
    "roberta_large.py": roberta_large.get_config(),
    "electra_small.py": electra_small.get_config(),
    "electra_base.py": electra_base.get_config(),
    "electra_large.py": electra_large.get_config(),
    "distilbert_base.py": distilbert_base.get_config(),
    "distilbert_minilm.py": distilbert_minilm.get_config(),
    "tiny.py": tiny.get_config(),
    **{f"modernbert_{size}.py:{phase}": module.get_config(phase) for size, module in
       (("base", modernbert_base), ("large", modernbert_large)) for phase in modernbert_base.PHASES},
}


def test_every_config_file_is_covered():
  files = {os.path.basename(p) for p in glob.glob(os.path.join(REPO, "configs", "*.py"))}
  assert files - {"__init__.py", "common.py"} == {name.split(":")[0] for name in CONFIGS}


def _num_params(abstract_state) -> int:
  return sum(math.prod(x.shape) for x in jax.tree.leaves(abstract_state.params))


def _fitted(config):
  """(config, mesh) over this machine's devices. A mesh chosen for a larger topology (`aot --search_mesh`)
  is validated against that topology's device count and built here with its tensor axis and as much of
  its fsdp axis as these devices hold. libtpu's compile-only devices are not used in this process: loaded
  beside the CPU backend, libtpu makes JAX's profiler crash a later test."""
  try:
    sharding.mesh_shape(config.mesh, jax.device_count())
  except ValueError:
    train.validate(config, tpu_chips.device_count(config.topology))
    config = config.copy_and_resolve_references()
    config.mesh.data = -1
    config.mesh.fsdp = math.gcd(config.mesh.fsdp, jax.device_count() // config.mesh.tensor)
  train.validate(config)
  return config, sharding.create_mesh(config.mesh)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_config_builds_its_abstract_sharded_train_state(name):
  config, mesh = _fitted(CONFIGS[name])
  s = train_setup.setup(config, mesh)   # eval_shape only: nothing is allocated
  n = _num_params(s.abstract_state)
  expected = {"bert_base": 110e6, "bert_large": 335e6, "roberta_base": 125e6, "roberta_large": 355e6, "tiny": 0.71e6,
              "albert_base": 11.8e6, "albert_large": 17.8e6, "albert_xlarge": 59.0e6, "albert_xxlarge": 223.1e6,
              "ltr_base": 110e6, "spanbert_base": 111e6, "spanbert_large": 338e6,
              # ELECTRA: the discriminator (14M, 110M, 335M; Clark et al. 2020, Table 1) + head + generator
              "electra_small": 14.3e6, "electra_base": 120.0e6, "electra_large": 355.7e6,
              # DistilBERT: the student only (the teacher is not a parameter): DistilBertModel's 66.4M + MLM head
              "distilbert_base": 67.0e6, "distilbert_minilm": 17.4e6,
              # transformers' ModernBertForMaskedLM, exactly (test_modernbert_release_recipe)
              "modernbert_base": 149_655_232, "modernbert_large": 395_881_664}
  assert n == pytest.approx(expected[name.split(".")[0]], rel=0.05)
  # Adam moments mirror the parameters, with the same shardings.
  adam, = [x for x in s.abstract_state.opt_state if isinstance(x, optimizer.ScaleByAdamState)]
  assert jax.tree.structure(adam.mu) == jax.tree.structure(s.abstract_state.params)
  word = s.abstract_state.params["bert"]["embeddings"]["word_embeddings"]["embedding"]
  assert word.sharding.spec == adam.nu["bert"]["embeddings"]["word_embeddings"]["embedding"].sharding.spec
  if config.mesh.fsdp > 1:
    assert "fsdp" in word.sharding.spec   # fsdp configs shard the big matrices
  batch = train_setup.abstract_batch(config)
  assert batch["input_ids"].shape == (config.global_batch_size, config.data.seq_length)
  assert ("next_sentence_labels" in batch) == (config.data.format in ("nsp", "sop"))   # sop: ALBERT


@pytest.mark.parametrize("module", [bert_base, bert_large])
def test_bert_paper_schedule(module):
  """Devlin et al. 2019, A.2: 256-sequence batches, 1M steps, 90% at seq 128, lr 1e-4, 10k warmup."""
  p1, p1_tokens, p2 = (module.get_config(arg) for arg in ("phase1", "phase1_tokens", "phase2"))
  for c in (p1, p1_tokens, p2):
    assert (c.optimizer.learning_rate, c.optimizer.warmup_steps, c.optimizer.total_steps) == (1e-4, 10_000, 10**6)
    assert (c.optimizer.b1, c.optimizer.b2, c.optimizer.weight_decay) == (0.9, 0.999, 0.01)
    assert c.data.format == "nsp" and not c.optimizer.bias_correction
  for c in (p1, p1_tokens):
    assert (c.data.seq_length, c.data.max_predictions_per_seq, c.train_steps) == (128, 20, 900_000)
  assert (p2.data.seq_length, p2.data.max_predictions_per_seq, p2.train_steps) == (512, 80, 1_000_000)
  # "batch size of 256 sequences (256 sequences * 512 tokens = 128,000 tokens/batch)": the literal
  # reading in phase 1 and phase 2; phase1_tokens keeps phase 2's tokens per batch at seq 128.
  tokens = lambda c: c.global_batch_size * c.data.seq_length
  assert (p1.global_batch_size, tokens(p1)) == (256, 32_768)
  assert (p1_tokens.global_batch_size, tokens(p1_tokens)) == (1024, 131_072)
  assert (p2.global_batch_size, tokens(p2)) == (256, 131_072)
  assert p2.init_from   # phase 2 continues phase 1
  assert p1.topology == p1_tokens.topology == {bert_base: "v3:4x4", bert_large: "v3:8x8"}[module]   # 16 / 64 chips
  with pytest.raises(ValueError, match="phase1_tokens"):
    module.get_config("phase3")


def test_layers_scanned_and_dropout_hashed_only_on_the_steps_that_gain():
  """One compiled layer body only where the step is compute-bound either way (v3's phase1_tokens): a config
  built on bert_base's must not inherit it for a memory-bound step on another chip or objective."""
  scanned = {name for name, c in CONFIGS.items()
             if name.startswith(("bert_base", "bert_large")) and train.bert_config(c).looped_layers}
  assert scanned == {
      "bert_base.py:phase1_tokens", "bert_large.py:phase1_tokens"}
  for topology, phase in bert_large.MESHES:
    c = bert_large.get_config(f"{phase},{topology}")
    looped = train.bert_config(c).looped_layers
    assert looped == (topology == "v3:8x8" and phase == "phase1_tokens"), (topology, phase)
    # Unrolled over the stacked params: v3's phase 1 (a compile under 30 s) and phase 2, and where XLA counted
    # fewer bytes so, v5e's phase 1 and phase1_tokens, v6e's phase1_tokens.
    stacked = c.model.scan_layers and not looped
    assert stacked == ((topology, phase) in {("v3:8x8", "phase1"), ("v3:8x8", "phase2"), ("v5e:8x8", "phase1"),
                                             ("v5e:8x8", "phase1_tokens"), ("v6e:8x8", "phase1_tokens")})
  assert not ltr_base.get_config("phase1_tokens").model.scan_layers
  # Likewise the dropout bits: the counter hash on v3, where XLA counts fewer FLOPs with it; threefry's on
  # v5e and v6e, where it counted fewer bytes.
  for topology, phase in bert_large.MESHES:
    c = bert_large.get_config(f"{phase},{topology}")
    assert c.model.dropout_bits == ("hash" if topology.startswith("v3") else "threefry"), (topology, phase)
    # and the keys they come from: the hash's own beside its bits (models/dropout_key.py)
    assert c.dropout_rng == ("hash" if topology.startswith("v3") else "threefry2x32"), (topology, phase)
  assert {bert_base.get_config(p).model.dropout_bits for p in bert_base.PHASES} == {"hash"}


def test_gelu_is_each_reference_codes():
  """BERT's configs take google-research/bert's tanh GELU in every phase (phase 2 continues phase 1's
  weights); the families whose code computes the exact erf form keep it, as do Hugging Face's presets."""
  from bert_jax.models.config import BertConfig
  from configs.ablations import roberta_table2
  bert = {name for name, c in CONFIGS.items() if name.startswith(("bert_base", "bert_large"))}
  assert bert and {CONFIGS[n].model.hidden_act for n in bert} == {"gelu_new"}
  assert ltr_base.get_config("phase1").model.hidden_act == "gelu_new"    # Devlin et al.'s LTR ablation
  assert roberta_table2.paper_base().model.hidden_act == "gelu"          # FAIRSEQ's BERT-base
  for name in ("roberta_base.py", "spanbert_base.py", "spanbert_large.py", "distilbert_base.py"):
    assert CONFIGS[name].model.hidden_act in (None, "gelu"), name
  assert BertConfig().hidden_act == "gelu"


@pytest.mark.parametrize("module, lr, warmup", [(roberta_base, 6e-4, 24_000), (roberta_large, 4e-4, 30_000)])
def test_roberta_paper_schedule(module, lr, warmup):
  """Liu et al. 2019, Table 9."""
  c = module.get_config()
  assert c.global_batch_size == 8192 and c.train_steps == c.optimizer.total_steps == 500_000
  assert (c.optimizer.learning_rate, c.optimizer.warmup_steps, c.optimizer.b2) == (lr, warmup, 0.98)
  assert c.data.format == "full_sentences" and c.data.seq_length == 512 and c.data.short_seq_prob == 0
  assert c.global_batch_size * c.data.seq_length == 8192 * 512


@pytest.mark.parametrize("module", [albert_base, albert_large, albert_xlarge, albert_xxlarge])
def test_albert_paper_recipe(module):
  """Lan et al. 2019, 4.1 and Table 1: LAMB, batch 4096, lr 0.00176, 125k steps, 512 tokens, E = 128,
  shared layers, SOP, n-gram masking, a 30k vocabulary."""
  c = module.get_config()
  assert (c.objective, c.optimizer.name, c.optimizer.learning_rate) == ("albert", "lamb", 0.00176)
  assert not c.optimizer.bias_correction   # google-research/albert's lamb_optimizer.py
  assert c.global_batch_size == 4096 and c.train_steps == c.optimizer.total_steps == 125_000
  assert (c.data.seq_length, c.data.format, c.data.ngram_masking, c.data.short_seq_prob) == (512, "sop", True, 0.1)
  cfg = train.bert_config(c)
  assert (cfg.embedding_size, cfg.share_layers, cfg.vocab_size, cfg.intermediate_size) == (
      128, True, 30_000, 4 * cfg.hidden_size)
  size = module.__name__.split("_")[-1]
  assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads) == {
      "base": (12, 768, 12), "large": (24, 1024, 16), "xlarge": (24, 2048, 16), "xxlarge": (12, 4096, 64)}[size]


@pytest.mark.parametrize("module", [spanbert_base, spanbert_large])
def test_spanbert_paper_recipe(module):
  """Joshi et al. 2020: span masking + SBO, one 512-token segment, no NSP, batch 256, 2.4M steps, lr 1e-4,
  decoupled weight decay 0.1, eps 1e-8 (4.2)."""
  c = module.get_config()
  assert (c.objective, c.data.format, c.data.span_masking, c.data.span_p, c.data.span_max_length) == (
      "spanbert", "doc_sentences", True, 0.2, 10)
  assert (c.data.seq_length, c.global_batch_size, c.train_steps, c.optimizer.learning_rate) == (
      512, 256, 2_400_000, 1e-4)
  assert (c.optimizer.weight_decay, c.optimizer.eps, c.data.short_seq_prob) == (0.1, 1e-8, 0.0)
  assert c.optimizer.clip_norm == 616   # the release's --clip-norm 1.0 after fairseq's world_size / ntokens
  assert "next_sentence_labels" not in train_setup.abstract_batch(c)


@pytest.mark.parametrize("module", [electra_small, electra_base, electra_large])
def test_electra_paper_recipe(module):
  """Clark et al. 2020, Table 6: sizes, generator fraction, mask rate, lr, batch, steps, Adam, warmup."""
  c = module.get_config()
  size = module.__name__.split("_")[-1]
  o = c.optimizer
  assert (c.objective, o.name, o.b1, o.b2, o.eps, o.weight_decay, o.warmup_steps) == (
      "electra", "adamw", 0.9, 0.999, 1e-6, 0.01, 10_000)
  recipe = (c.generator_hidden_fraction, c.data.masked_lm_prob, o.learning_rate, c.global_batch_size, c.train_steps,
            c.data.seq_length)
  assert recipe == {"small": (1 / 4, 0.15, 5e-4, 128, 1_000_000, 128), "base": (1 / 3, 0.15, 2e-4, 256, 766_000, 512),
                    "large": (1 / 4, 0.25, 2e-4, 2048, 400_000, 512)}[size]
  assert o.total_steps == c.train_steps and c.data.format == "doc_segments" and c.data.short_seq_prob == 0.05
  cfg = train.bert_config(c)
  assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.intermediate_size, cfg.embedding_dim) == {
      "small": (12, 256, 4, 1024, 128), "base": (12, 768, 12, 3072, 768), "large": (24, 1024, 16, 4096, 1024)}[size]
  gen = electra.generator_config(cfg, c.generator_hidden_fraction)
  assert (gen.hidden_size, gen.num_heads, gen.intermediate_size) == {
      "small": (64, 1, 256), "base": (256, 4, 1024), "large": (256, 4, 1024)}[size]
  assert "next_sentence_labels" not in train_setup.abstract_batch(c)


def test_distilbert_paper_recipe():
  """Sanh et al. 2019 and the released distillation code: 6 of BERT-base's 12 layers, no token types, 4k
  batches by accumulation, lr 5e-4 with 5% warmup, eps 1e-6, no weight decay, clip 5, T = 2, 5/2/1."""
  from bert_jax.objectives import distilbert  # pylint: disable=g-import-not-at-top
  c = distilbert_base.get_config()
  o, cfg = c.optimizer, train.bert_config(c)
  assert (c.objective, cfg.num_layers, cfg.hidden_size, cfg.type_vocab_size, c.data.format) == (
      "distilbert", 6, 768, 0, "full_sentences")
  assert (c.global_batch_size, c.micro_batches, c.data.seq_length) == (4096, 8, 512)
  assert (o.learning_rate, o.warmup_steps, o.b1, o.b2, o.eps, o.weight_decay, o.clip_norm) == (
      5e-4, int(0.05 * c.train_steps), 0.9, 0.98, 1e-6, 0.0, 5.0)   # distiller.py: betas=(0.9, 0.98)
  assert (c.distill.temperature, c.distill.soft_positions, distilbert.LOSS_TERMS) == (
      2.0, "all", {"soft": 5.0, "mlm": 2.0, "cos": 1.0})
  assert distilbert.teacher_config(c).num_layers == 12 and "next_sentence_labels" not in train_setup.abstract_batch(c)


def test_ltr_is_bert_base_with_a_causal_mask_and_no_nsp():
  """Devlin et al. 2019, Table 5 "LTR & No NSP": BERT-base's schedule, a left-to-right model."""
  c, b = ltr_base.get_config(), bert_base.get_config()
  assert (c.objective, c.model.causal, c.data.format) == ("ltr", True, "full_sentences")
  assert (c.optimizer.to_dict(), c.train_steps, c.global_batch_size) == (b.optimizer.to_dict(), b.train_steps,
                                                                          b.global_batch_size)


@pytest.mark.parametrize("module", [modernbert_base, modernbert_large])
def test_modernbert_release_recipe(module):
  """Warner et al. 2024 as released (AnswerDotAI/ModernBERT yamls/modernbert/*.yaml): sizes, switches,
  30% masking, packed 1024- then 8192-token rows, StableAdamW, one warmup-stable-decay schedule over the
  three phases, tokens per phase; the parameter count of transformers' ModernBertForMaskedLM."""
  size = module.__name__.split("_")[-1]
  phases = {p: module.get_config(p) for p in modernbert_base.PHASES}
  rows, lr, wd, warmup_tokens, count = {
      "base": ((4608, 576, 576), (8e-4, 3e-4, 3e-4), (1e-5, 1e-5, 1e-5), 3e9, 149_655_232),
      "large": ((4928, 616, 624), (5e-4, 5e-5, 5e-5), (1e-5, 1e-6, 1e-6), 2e9, 395_881_664)}[size]
  tokens = (1.719e12, 250e9, 50e9)
  assert module.get_config().to_dict() == phases["phase1"].to_dict()
  ends = []
  for (phase, c), n, length, r, l, w in zip(phases.items(), tokens, (1024, 8192, 8192), rows, lr, wd):
    cfg, o = train.bert_config(c), c.optimizer
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.intermediate_size) == {
        "base": (22, 768, 12, 1152), "large": (28, 1024, 16, 2624)}[size]
    assert (cfg.vocab_size, cfg.type_vocab_size, cfg.layer_norm_eps, cfg.global_attn_every_n_layers,
            cfg.local_attention) == (50368, 0, 1e-5, 3, 128)
    assert cfg.geglu and cfg.pre_norm and cfg.final_norm and not cfg.norm_bias and not cfg.dense_bias
    assert (cfg.rope_theta, cfg.local_rope_theta) == ((10_000.0, None) if phase == "phase1" else (160_000.0, 10_000.0))
    assert (cfg.hidden_dropout, cfg.attention_dropout) == (0.0, 0.0)
    assert (c.objective, c.data.format, c.data.packing, c.data.masked_lm_prob) == ("modernbert", "doc_sentences",
                                                                                   True, 0.3)
    assert (c.data.seq_length, c.global_batch_size, c.data.max_predictions_per_seq) == (length, r,
                                                                                      math.ceil(0.3 * length))
    assert (o.name, o.learning_rate, o.weight_decay, o.b1, o.b2, o.eps, o.clip_norm) == (
        "stable_adamw", l, w, 0.9, 0.98, 1e-6, 0.0)
    steps = c.train_steps - (ends[-1] if ends else 0)
    assert steps == math.ceil(n / (r * length)) and (steps - 1) * r * length < n
    ends.append(c.train_steps)
    assert (o.schedule, o.decay_shape, o.final_lr_fraction, o.warmup_steps) == (
        "wsd", "1-sqrt", 0.001, math.ceil(warmup_tokens / (rows[0] * 1024)))
    assert (o.total_steps, o.decay_steps) == (phases["decay"].train_steps, steps if phase == "decay" else o.decay_steps)
  schedule = optimizer.learning_rate_schedule(phases["decay"].optimizer)
  # Constant through phase 1 and the extension at each phase's rate; the decay phase ends at 0.001 x its peak.
  lr1 = optimizer.learning_rate_schedule(phases["phase1"].optimizer)
  assert float(lr1(ends[0] - 1)) == pytest.approx(lr[0]) and float(lr1(phases["phase1"].optimizer.warmup_steps // 2)) < lr[0]
  assert float(schedule(ends[1])) == pytest.approx(lr[2]) and float(schedule(ends[2])) == pytest.approx(lr[2] * 1e-3)
  s = train_setup.setup(phases["extension"], sharding.create_mesh(phases["extension"].mesh))
  assert _num_params(s.abstract_state) == count


def _parse(*args):
  fv = flags.FlagValues()
  # Override flags are defined from the --config found in `sys_argv`, as main.py does with sys.argv.
  config_flags.DEFINE_config_file("config", flag_values=fv, lock_config=True, sys_argv=["prog", *args])
  fv(["prog", *args])
  return fv.config


def test_command_line_overrides_any_field():
  c = _parse(f"--config={REPO}/configs/bert_large.py:phase2", "--config.optimizer.learning_rate=5e-5",
             "--config.model.num_layers=2", "--config.data.packing=True", "--config.mesh.fsdp=8")
  assert (c.optimizer.learning_rate, c.model.num_layers, c.data.packing, c.mesh.fsdp) == (5e-5, 2, True, 8)
  assert c.data.seq_length == 512
  t = _parse(f"--config={REPO}/configs/tiny.py", "--config.train_steps=77")
  assert (t.train_steps, t.optimizer.total_steps) == (77, tiny.get_config().optimizer.total_steps)   # independent fields


def test_bert_large_takes_a_topology_and_ships_its_searched_mesh():
  """`:phase,topology` (the config flag splits at the first colon only): the chip's peak, the mesh
  `aot --search_mesh` ranked first there and the remat policy that compiled to fewer bytes; the paper's v3:8x8 without one; none for a topology
  not searched."""
  c = _parse(f"--config={REPO}/configs/bert_large.py:phase1,v5e:8x8")
  assert (c.topology, c.peak_flops_per_device, c.model.remat_policy) == ("v5e:8x8", 197e12, "full")
  assert sharding.mesh_shape(c.mesh, 64) == (2, 16, 2)
  v3 = bert_large.get_config("phase1")
  assert (v3.topology, v3.peak_flops_per_device, v3.model.remat_policy) == ("v3:8x8", 61.5e12, "none")
  assert sharding.mesh_shape(v3.mesh, 128) == (1, 64, 2)
  assert bert_large.get_config("phase2,v3:8x8").to_dict() == bert_large.get_config("phase2").to_dict()
  with pytest.raises(ValueError, match="no searched mesh for 'v4:4x4x4'.*--search_mesh"):
    bert_large.get_config("phase1,v4:4x4x4")
  with pytest.raises(ValueError, match="phase1_tokens"):
    bert_large.get_config("phase3,v5e:8x8")


def test_unknown_field_is_an_error():
  with pytest.raises(Exception, match="misspelt_field"):
    _parse(f"--config={REPO}/configs/tiny.py", "--config.misspelt_field=1")
  with pytest.raises(AttributeError):
    tiny.get_config().optimizer.learnig_rate = 1.0


@pytest.mark.parametrize("change, message", [
    ({"global_batch_size": 12}, "not divisible by data-parallel size 8"),
    ({"micro_batches": 3}, "micro_batches 3"),
    ({"data.seq_length": 256}, "exceeds the model's 128 position embeddings"),
    ({"mesh.tensor": 3}, "mesh:"),
    ({"data.format": "nsp_typo"}, "data.format"),
])
def test_invalid_configs_stop_before_compiling(change, message):
  c = tiny.get_config()
  for key, value in change.items():
    target = c
    *path, last = key.split(".")
    for p in path:
      target = target[p]
    target[last] = value
  with pytest.raises(ValueError, match=message):
    train.validate(c)

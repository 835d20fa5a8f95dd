"""The real train step on every mesh shape of the 8 CPU devices: the same losses; FSDP divides memory."""

import math
import re

import jax
import numpy as np
import pytest

from bert_jax import sharding, train, train_setup
from bert_jax.models import config as model_config
from conftest import shipped_steps_in_ci
from configs import tiny


def _config(data=-1, fsdp=1, tensor=1, vocab_on_tensor=True, dropout_bits="threefry"):
  c = tiny.get_config()
  c.model.dropout_bits = dropout_bits
  # One layer: every layer is sharded alike, and each one more only lengthens the compiles.
  c.model.vocab_size, c.model.hidden_size, c.model.intermediate_size, c.model.num_layers = 256, 32, 64, 1
  c.model.max_position_embeddings = c.data.seq_length = 32
  c.model.hidden_dropout = c.model.attention_dropout = 0.1   # BERT's; the dropout key is then used
  c.data.max_predictions_per_seq = 5
  c.global_batch_size = 16
  c.optimizer.warmup_steps = 0   # the first step updates the parameters: the second loss is after an update
  c.model.num_heads = 4
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = data, fsdp, tensor
  if not vocab_on_tensor:   # the embedding and the MLM logits whole on each tensor shard
    c.logical_axis_rules = tuple((name, None if name in ("vocab", "activation_vocab") else axes)
                                 for name, axes in c.logical_axis_rules)
  return c


def _mesh_setup(data=1, fsdp=4, tensor=2, **model):
  """(config, train_setup.setup) of `_config` on that mesh with `model`'s settings."""
  config = _config(data=data, fsdp=fsdp, tensor=tensor)
  config.model.update(model)
  return config, train_setup.setup(config, sharding.create_mesh(config.mesh))


def random_batch(config, seed=0) -> dict[str, np.ndarray]:
  """A global batch of random ids and labels, with the pipeline's shapes and dtypes."""
  rng = np.random.default_rng(seed)
  vocab = train.bert_config(config).vocab_size
  batch = {}
  for name, s in train_setup.abstract_batch(config).items():
    if name == "masked_lm_positions":
      batch[name] = rng.integers(0, config.data.seq_length, s.shape).astype(s.dtype)
    elif name in ("input_ids", "masked_lm_ids"):
      batch[name] = rng.integers(1, vocab, s.shape).astype(s.dtype)
    elif name in ("segment_ids", "next_sentence_labels"):
      batch[name] = rng.integers(0, 2, s.shape).astype(s.dtype)
    else:  # input_mask, masked_lm_weights
      batch[name] = np.ones(s.shape, s.dtype)
  batch["input_mask"][:, -4:] = 0  # some padding, so masks are exercised
  return batch


@pytest.fixture(scope="module")
def setups():
  """(config, train_setup.setup) per mesh shape, built once: the memory test lowers the (8, 1, 1) and (1, 8, 1)
  steps the loss test has already run, and finds them compiled."""
  built = {}

  def get(data, fsdp=1, tensor=1, devices=None, vocab_on_tensor=True, dropout_bits="threefry"):
    key = (data, fsdp, tensor, devices is None, vocab_on_tensor, dropout_bits)
    if key not in built:
      config = _config(data, fsdp, tensor, vocab_on_tensor, dropout_bits)
      built[key] = config, train_setup.setup(config, sharding.create_mesh(config.mesh, devices=devices))
    return built[key]
  return get


def _losses(config, s, steps=2, state=None) -> list[tuple[float, float]]:
  """(loss, gradient norm) of `steps` train steps from `s.init`'s state (or `state`) on random batches. The
  norm as well: Adam's first update, and with it the second loss, hardly moves with the gradient's scale."""
  mesh = s.mesh
  init_rng, dropout_rng = jax.random.split(jax.random.key(0))
  state = s.init(init_rng) if state is None else state
  losses = []
  for i in range(steps):
    batch = sharding.global_batch(random_batch(config, seed=i), mesh)
    state, metrics = s.train_step(state, batch, dropout_rng)
    losses.append((float(metrics["loss"]), float(metrics["grad_norm"])))
  return losses


@pytest.mark.slow
def test_same_losses_on_every_mesh(setups):
  # Dropout on: partitionable threefry draws the same bits whatever the sharding.
  reference = _losses(*setups(data=1, devices=jax.devices()[:1]))
  for data, fsdp, tensor in [(8, 1, 1), (2, 4, 1), (2, 2, 2), (1, 8, 1)]:
    losses = _losses(*setups(data, fsdp, tensor))
    # The second loss is after one update, so gradients, clipping and AdamW agree as well.
    np.testing.assert_allclose(losses, reference, rtol=2e-5, err_msg=f"mesh {(data, fsdp, tensor)}")
  # Tensor over 4 with the vocabulary off it (logical rules), as aot's mesh search may pick.
  np.testing.assert_allclose(_losses(*setups(2, 1, 4, vocab_on_tensor=False)), reference, rtol=2e-5)
  assert reference[1][0] != reference[0][0]


@pytest.mark.slow
def test_hash_dropout_bits_are_the_same_on_every_mesh(setups):
  # model.dropout_bits "hash" (models/dropout.py): a counter hash of each element's index, partitioned.
  reference = _losses(*setups(data=1, devices=jax.devices()[:1], dropout_bits="hash"))
  for data, fsdp, tensor in [(2, 2, 2), (1, 8, 1)]:
    np.testing.assert_allclose(_losses(*setups(data, fsdp, tensor, dropout_bits="hash")), reference, rtol=2e-5,
                               err_msg=f"mesh {(data, fsdp, tensor)}")
  assert reference[0][0] != _losses(*setups(data=1, devices=jax.devices()[:1]))[0][0]   # other bits, another loss


@pytest.mark.slow
def test_remat_keeps_the_losses_with_dropout(setups):
  # Recomputed layers redraw the same dropout bits: the losses (the second after an update) are those
  # of the step that saves every activation.
  reference = _losses(*setups(data=1, devices=jax.devices()[:1]))
  for policy in ("minimal", "full"):
    config = _config(data=1)
    config.model.remat_policy = policy
    losses = _losses(config, train_setup.setup(config, sharding.create_mesh(config.mesh, devices=jax.devices()[:1])))
    np.testing.assert_allclose(losses, reference, rtol=2e-5, err_msg=policy)


@pytest.mark.slow
def test_fused_qkv_keeps_the_losses_and_each_tensor_shard_its_own_heads(setups):
  # model.fused_qkv on data 2 x fsdp 2 x tensor 2: the losses of the three matmuls, and the kernels stacked
  # where they lie, so that the attention's only collectives are the stacked matrix's gather (of its
  # [3, 32, 32 / 2] tensor shard: each shard's own heads of query, key and value) and its input gradient's
  # all-reduce; heads moved between tensor shards would add an all-to-all, a permute or a wider gather.
  reference = _losses(*setups(2, 2, 2))
  config = _config(2, 2, 2)
  config.model.fused_qkv = True
  s = train_setup.setup(config, sharding.create_mesh(config.mesh))
  np.testing.assert_allclose(_losses(config, s), reference, rtol=2e-5)
  collectives = re.findall(r"= (\S+?)\{[^}]*\} (all-gather|all-reduce|all-to-all|collective-permute|reduce-scatter)"
                           r"(?:-start)?\(.*?op_name=\"[^\"]*/attention/", _compiled_step(config, s).as_text())
  assert sorted(collectives) == [("f32[16,32]", "all-gather"), ("f32[3,32,16]", "all-gather"),
                                 ("f32[32]", "all-gather"), ("f32[4,32,32]", "all-reduce")], collectives


def _compiled_step(config, s):
  rng = jax.eval_shape(lambda: jax.random.key(0))
  # The batch as `_losses` passes it, sharded: the lowering (and its executable) is then the one the
  # jitted step already compiled when it ran.
  batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=s.batch_shardings[k])
           for k, v in train_setup.abstract_batch(config).items()}
  return s.train_step.lower(s.abstract_state, batch, rng).compile()


def _bytes_per_device(abstract_tree) -> int:
  """Bytes of one device's shard of every leaf (ShapeDtypeStructs carrying NamedShardings)."""
  return sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(abstract_tree))


@pytest.mark.slow
def test_fsdp_divides_state_bytes_per_device(setups):
  (data_cfg, data_setup), (fsdp_cfg, fsdp_setup) = setups(data=8), setups(data=1, fsdp=8)
  data_step, fsdp_step = _compiled_step(data_cfg, data_setup), _compiled_step(fsdp_cfg, fsdp_setup)
  replicated = _bytes_per_device(data_setup.abstract_state)
  sharded = _bytes_per_device(fsdp_setup.abstract_state)
  # Every matrix, embedding and layer norm has an `embed` axis (-> fsdp); the other biases stay
  # replicated (6.9x smaller here, with hidden size 32 and one layer).
  assert sharded < replicated / 6
  batch_bytes = sum(math.prod(s.shape) * s.dtype.itemsize for s in train_setup.abstract_batch(data_cfg).values()) // 8
  key_bytes = jax.random.key_data(jax.random.key(0)).nbytes
  for step, state_bytes in ((data_step, replicated), (fsdp_step, sharded)):
    memory = step.memory_analysis()
    # What XLA allocates for the arguments: the state shard, 1/8 of the batch and the dropout key.
    assert memory.argument_size_in_bytes == state_bytes + batch_bytes + key_bytes
    # The state is donated: the new state reuses its buffers.
    assert memory.alias_size_in_bytes == state_bytes
  assert fsdp_step.memory_analysis().argument_size_in_bytes < data_step.memory_analysis().argument_size_in_bytes / 5


@pytest.mark.slow
@pytest.mark.parametrize("model, split_tensor", shipped_steps_in_ci("v3:8x8:phase1"))
def test_each_shipped_bert_large_step_keeps_the_plain_losses(model, split_tensor):
  """How a shipped TPU step computes, all at once (`shipped_bert_large_steps`: the decoder and the lookup on
  shards, the fused query-key-value matmul, the LayerNorm kernel in Pallas' interpreter, remat, scanned
  layers, each weight gathered once or again, ...), takes the losses and gradient norms of the step with
  every one of those fields at BertConfig's default, on the same mesh and from the same parameters, dropout
  on, the second step after an update (relative 2e-5). Both draw the entry's dropout bits (the hash's are
  tested against threefry's distribution in tests/test_dropout.py). Scanned layers draw theirs from the
  scan's split of the key, other masks than the unrolled layers', whatever the layers a trip
  (`scan_unroll`): a scanned entry is compared with the plain step scanned, a loop of one layer a trip.
  CI runs v5e:8x8's and v3:8x8's phase 1 (the configs' default step: the LayerNorm kernel, the stack unrolled
  over its stacked params, each weight gathered once) and v3's `phase1_tokens` (`shipped_steps_in_ci`)."""
  mesh = dict(data=1, fsdp=4, tensor=2) if split_tensor else dict(data=2, fsdp=4, tensor=1)
  defaults = {name: getattr(model_config.BertConfig(), name) for name in model}
  common = dict(num_layers=2)
  plain_config, plain = _mesh_setup(**mesh, **common, **{**defaults, "dropout_bits": model["dropout_bits"],
                                                         "scan_layers": model["scan_layers"]})
  _, shipped = _mesh_setup(**mesh, **common, **model)
  plain_state, state = plain.init(jax.random.key(0)), plain.init(jax.random.key(0))   # each step donates its own
  reference = _losses(plain_config, plain, state=plain_state)
  np.testing.assert_allclose(_losses(plain_config, shipped, state=state), reference, rtol=2e-5)
  assert reference[1][0] != reference[0][0]


@pytest.mark.slow
@pytest.mark.parametrize("extra", [{}, {"fused_qkv": True, "decoder_on_shards": True, "reshard_after_forward": False}],
                         ids=["plain", "fused_qkv_decoder_on_shards"])
def test_library_matmuls_keep_the_losses_over_fsdp_and_tensor(extra):
  """`model.matmuls` "library" (models/library_matmul.py: the products' transposes and 3-D relayouts of
  the rows) on data 1 x fsdp 4 x tensor 2, the heads and the vocabulary split over tensor: the losses and
  gradient norms of XLA's products on the same mesh, dropout on, the second step after an update."""
  mesh = dict(data=1, fsdp=4, tensor=2)
  plain_config, plain = _mesh_setup(**mesh, **extra)
  _, library = _mesh_setup(**mesh, **extra, matmuls="library")
  reference = _losses(plain_config, plain)
  np.testing.assert_allclose(_losses(plain_config, library), reference, rtol=2e-5)
  assert reference[1][0] != reference[0][0]


def test_a_mesh_that_splits_the_model_unevenly_stops_before_anything_compiles():
  """jit refuses an uneven sharding only when the first step compiles: `train.validate` names the size and
  the mesh axis first (a vocabulary of 257 over tensor 2, ELECTRA's one-head generator over tensor 2), and
  `aot --search_mesh` leaves such meshes out."""
  from bert_jax import failures  # pylint: disable=g-import-not-at-top
  from bert_jax.tools import mesh_search  # pylint: disable=g-import-not-at-top
  c = _config(data=1, fsdp=4, tensor=2)
  train.validate(c)
  c.model.vocab_size = 257
  with pytest.raises(failures.UserError, match=r"vocab 257 over tensor \(2\) unevenly"):
    train.validate(c)
  assert {t for _, _, t in mesh_search.mesh_candidates(c, 8)} == {1}
  c.logical_axis_rules = tuple((name, None if name in ("vocab", "activation_vocab") else axes)
                               for name, axes in c.logical_axis_rules)
  train.validate(c)   # the vocabulary whole on each tensor shard
  e = _config(data=1, fsdp=4, tensor=2)
  e.objective, e.data.format = "electra", "full_sentences"
  with e.unlocked():
    e.generator_hidden_fraction = 0.25   # 1 head of 4
  with pytest.raises(failures.UserError, match=r"heads 1 over tensor \(2\) unevenly"):
    train.validate(e)
  assert {t for _, _, t in mesh_search.mesh_candidates(e, 8)} == {1}

"""`model.matmuls` "library": the products autodiff's (the pretraining model's losses and gradients too), and each
function's compiled dots (the projections', the tied decoder's, the attention's) bfloat16 x bfloat16 -> float32,
the types of XLA:CPU's library form, where the plain products' are not."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.models import encoder as model
from bert_jax.models import heads
from bert_jax.models import library_matmul
from bert_jax.models import softmax_dropout


def _plain(x, w, b):
  return jnp.einsum("...k,kn->...n", x, w) + b


def _operands(dtype, rows=(4, 6)):
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(*rows, 16)), dtype)
  w = jnp.asarray(rng.normal(size=(16, 24)), dtype)
  b = jnp.asarray(rng.normal(size=(24,)), dtype)
  g = jnp.asarray(rng.normal(size=(*rows, 24)), jnp.float32)
  return x, w, b, g


def _grads(fn, x, w, b, g, value=False):
  loss = lambda x, w, b: jnp.sum(fn(x, w, b).astype(jnp.float32) * g)  # noqa: E731
  return (jax.value_and_grad if value else jax.grad)(loss, argnums=(0, 1, 2))(x, w, b)


@pytest.mark.parametrize("rows", [(4, 6), (2, 3, 5), (7,)])   # 7 rows do not factor: the plain weight gradient
def test_affine_is_autodiffs_product_in_float32(rows):
  x, w, b, g = _operands(jnp.float32, rows)
  np.testing.assert_allclose(library_matmul.affine(x, w, b), _plain(x, w, b), rtol=1e-6, atol=1e-6)
  for ours, theirs in zip(_grads(library_matmul.affine, x, w, b, g), _grads(_plain, x, w, b, g)):
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [12, 16, 7])   # rows that factor, and 7, which does not
@pytest.mark.parametrize("k,n", [(8, 32), (32, 8), (64, 1), (64, 2), (64, 3), (64, 7), (2, 64), (5, 64)])
def test_weight_gradient_is_x_transposed_times_g(rows, k, n):
  """Either operand transposed (x where it is the smaller, else g and the result), for any width: a
  classifier's 1, 2 or 3 labels and a prime width leave a result that does not factor."""
  rng = np.random.default_rng(1)
  x, g = rng.normal(size=(rows, k)).astype(np.float32), rng.normal(size=(rows, n)).astype(np.float32)
  got = library_matmul.rows_transposed_product(jnp.asarray(x), jnp.asarray(g), jnp.float32)
  np.testing.assert_allclose(got, x.T @ g, rtol=1e-5, atol=1e-5)
  w = jnp.asarray(rng.normal(size=(k, n)), jnp.float32)
  d_w = jax.grad(lambda w: jnp.sum(library_matmul.matmul(jnp.asarray(x), w) * g))(w)
  np.testing.assert_allclose(d_w, x.T @ g, rtol=1e-5, atol=1e-5)


def test_bfloat16_gradients_are_the_float32_ones_rounded():
  x, w, b, g = _operands(jnp.bfloat16)
  grads = _grads(library_matmul.affine, x, w, b, g)
  assert [a.dtype for a in grads] == [jnp.bfloat16] * 3
  f32 = [a.astype(jnp.float32) for a in (x, w, b)]
  reference = _grads(_plain, *f32, g.astype(jnp.bfloat16).astype(jnp.float32))
  for ours, theirs in zip(grads, reference):
    np.testing.assert_allclose(np.asarray(ours, np.float32), theirs, rtol=2e-2, atol=5e-2)


def _dot_types(fn, *args) -> list[tuple[str, str, str]]:
  """(result, lhs, rhs) element types of every dot in `fn`'s optimized HLO on this backend."""
  hlo = jax.jit(fn).lower(*args).compile().as_text()
  types = dict(re.findall(r"^\s*(?:ROOT )?(%\S+) = (\w+)\[", hlo, re.M))
  dots = re.findall(r"= (\w+)\[[^\]]*\]\S* dot\((%[^,\s]+), (%[^,\s)]+)\)", hlo)
  return [(out, types[lhs], types[rhs]) for out, lhs, rhs in dots]


def test_every_bfloat16_product_is_in_the_library_form():
  """The forward product, x's gradient and w's gradient each a bfloat16 x bfloat16 -> float32 dot, the
  form XLA:CPU runs on its matrix library (AMX; `xla/backends/cpu/ynn_support.cc`). Autodiff's products of
  the plain einsum are converted to float32 first (the next test): this check tells them apart."""
  x, w, b, g = _operands(jnp.bfloat16, rows=(16, 64))
  types = _dot_types(lambda x, w, b: _grads(library_matmul.affine, x, w, b, g, value=True), x, w, b)
  assert types == [("f32", "bf16", "bf16")] * 3, types


def test_plain_bfloat16_products_are_not_in_the_library_form():
  x, w, b, g = _operands(jnp.bfloat16, rows=(16, 64))
  types = _dot_types(lambda x, w, b: _grads(_plain, x, w, b, g, value=True), x, w, b)
  assert len(types) == 3 and any(t != ("f32", "bf16", "bf16") for t in types), types


def test_tied_decoder_gradients_in_the_library_form():
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(2, 10, 16)), jnp.bfloat16)
  table = jnp.asarray(rng.normal(size=(96, 16)), jnp.bfloat16)
  bias = jnp.zeros((96,), jnp.float32)
  w = jnp.asarray(rng.normal(size=(2, 10, 96)), jnp.float32)

  def grads(library):
    return jax.value_and_grad(lambda x, t, b: jnp.sum(heads.tied_logits(x, t, b, library) * w), argnums=(0, 1, 2))

  types = _dot_types(grads(True), x, table, bias)
  matmuls = [t for t in types if t[1] == t[2] == "bf16"]
  assert matmuls == [("f32", "bf16", "bf16")] * 3, types   # the bias's gradient is the float32 dot
  for ours, theirs in zip(grads(True)(x, table, bias)[1], grads(False)(x, table, bias)[1]):
    np.testing.assert_allclose(np.asarray(ours, np.float32), np.asarray(theirs, np.float32), rtol=2e-2, atol=2e-2)


@pytest.mark.slow
@pytest.mark.parametrize("dtype,scan,fused_qkv", [(jnp.float32, False, False), (jnp.bfloat16, False, False),
                                                 (jnp.float32, True, False), (jnp.float32, False, True)])
def test_pretraining_model_with_library_matmuls_is_the_plain_one(dtype, scan, fused_qkv):
  """The same parameter tree; losses and gradients the plain model's (float32 to 1e-5; bfloat16 to its
  rounding), with dropout (the attention through `softmax_dropout.attend`), scanned layers and the fused
  query-key-value product too. The NSP head's 2 outputs and the batch's 2 rows are widths that do not
  factor."""
  cfg = model.BertConfig.from_preset("tiny", vocab_size=64, max_position_embeddings=32, hidden_dropout=0.1,
                                     attention_dropout=0.1, dtype=dtype, scan_layers=scan, dropout_bits="hash",
                                     fused_qkv=fused_qkv)
  rng = np.random.default_rng(0)
  ids = jnp.asarray(rng.integers(0, 64, (2, 8)), jnp.int32)
  mask, seg = jnp.ones_like(ids), jnp.zeros_like(ids)
  positions = jnp.asarray([[1, 3], [2, 5]], jnp.int32)
  labels = jnp.asarray(rng.integers(0, 64, (2, 2)), jnp.int32)
  plain = heads.BertForPreTraining(cfg)
  library = heads.BertForPreTraining(dataclasses.replace(cfg, matmuls="library"))
  batch = {"input_ids": ids, "input_mask": mask, "segment_ids": seg, "masked_lm_positions": positions}
  params = plain.init(jax.random.key(0), batch)["params"]
  assert jax.tree.structure(params) == jax.tree.structure(library.init(jax.random.key(0), batch)["params"])

  def loss(module, params):
    out = module.apply({"params": params}, batch, deterministic=False, rngs={"dropout": jax.random.key(3)})
    mlm, nsp = out["mlm_logits"], out["nsp_logits"]
    logp = jax.nn.log_softmax(mlm.astype(jnp.float32))
    return -jnp.take_along_axis(logp, labels[..., None], -1).mean() + nsp.astype(jnp.float32).sum()

  (l_plain, g_plain), (l_lib, g_lib) = (jax.jit(jax.value_and_grad(lambda p, m=m: loss(m, p)))(params)
                                        for m in (plain, library))
  tol = 1e-5 if dtype == jnp.float32 else 3e-2
  np.testing.assert_allclose(l_lib, l_plain, rtol=tol)
  for a, b in zip(jax.tree.leaves(g_lib), jax.tree.leaves(g_plain)):
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_attention_products_in_the_library_form_give_the_same_values(dtype):
  """`softmax_dropout.attend` with `library`: its six products bfloat16 x bfloat16 -> float32 (in bfloat16),
  the context and gradients those of the plain products (XLA:CPU computes a bfloat16 product in float32
  either way, so to the last bit here)."""
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.normal(size=(2, 16, 4, 8)), dtype) for _ in range(3))
  mask = jnp.ones((2, 1, 1, 16), bool)
  d_context = jnp.asarray(rng.normal(size=(2, 16, 4, 8)), jnp.float32)

  def run(library):
    def loss(q, k, v):
      out = softmax_dropout.attend(q, k, v, mask, jax.random.key(1), 0.1, dtype, dtype, "hash", library)
      return jnp.sum(out.astype(jnp.float32) * d_context)
    return jax.value_and_grad(loss, argnums=(0, 1, 2))

  (l_lib, g_lib), (l_plain, g_plain) = jax.jit(run(True))(q, k, v), jax.jit(run(False))(q, k, v)
  np.testing.assert_allclose(l_lib, l_plain, rtol=1e-6)
  for a, b in zip(g_lib, g_plain):
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=1e-6, atol=1e-6)
  if dtype == jnp.bfloat16:
    types = _dot_types(run(True), q, k, v)
    assert types == [("f32", "bf16", "bf16")] * 6, types
    assert any(t != ("f32", "bf16", "bf16") for t in _dot_types(run(False), q, k, v))


@pytest.mark.slow
@pytest.mark.parametrize("pruned", [False, True])
def test_classifier_head_trains_under_library_matmuls(pruned):
  """A finetuning classifier (2 labels, 8 rows: the weight gradient's result [2, H] does not factor) gets the
  plain model's gradients, every kernel a nonzero one; also with every head of a layer pruned, whose
  projections are zero wide."""
  heads_pruned = {1: tuple(range(model.BertConfig.from_preset("tiny").num_heads))} if pruned else {}
  cfg = model.BertConfig.from_preset("tiny", vocab_size=64, max_position_embeddings=32, hidden_dropout=0.0,
                                     attention_dropout=0.0, pruned_heads=heads_pruned)
  rng = np.random.default_rng(0)
  ids = jnp.asarray(rng.integers(0, 64, (8, 8)), jnp.int32)
  labels = jnp.asarray(rng.integers(0, 2, (8,)), jnp.int32)
  grads = {}
  for matmuls in ("xla", "library"):
    c = dataclasses.replace(cfg, matmuls=matmuls)
    module = heads.BertForSequenceClassification(c, num_labels=2)
    params = module.init(jax.random.key(0), ids, jnp.ones_like(ids), jnp.zeros_like(ids))["params"]

    def loss(params, module=module):
      logits = module.apply({"params": params}, ids, jnp.ones_like(ids), jnp.zeros_like(ids))
      return -jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], -1).mean()
    grads[matmuls] = jax.grad(loss)(params)
  flat = jax.tree_util.tree_flatten_with_path(grads["library"])[0]
  for (path, a), b in zip(flat, jax.tree.leaves(grads["xla"])):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=jax.tree_util.keystr(path))
    assert a.size == 0 or np.abs(np.asarray(a)).max() > 0, jax.tree_util.keystr(path)


def test_a_bfloat16_cpu_run_is_told_of_the_library_form():
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
  cfg = model.BertConfig.from_preset("tiny", dtype=jnp.bfloat16)
  assert "matmuls=library" in library_matmul.matmuls_hint(cfg, mesh)
  assert library_matmul.matmuls_hint(dataclasses.replace(cfg, matmuls="library"), mesh) is None
  assert library_matmul.matmuls_hint(dataclasses.replace(cfg, dtype=jnp.float32), mesh) is None

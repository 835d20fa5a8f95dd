"""The decoder tied to the word embeddings: x @ table^T + bias with its own backward pass (`tied_logits`)."""

import functools

import jax
import jax.numpy as jnp

from bert_jax.models import library_matmul


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def tied_logits(x_PE, table_VE, bias_V, library: bool = False):
  """x [..., E] @ table [V, E]^T + bias [V] -> float32 logits [..., V] (the decoder tied to the word
  embeddings, and its output bias).

  x and the table are in the compute dtype. The backward pass hands their gradients' matmuls the logits'
  gradient in that dtype, as every other matmul of the step gets its output's gradient. Autodiff would
  hand them the float32 one, and then the table's gradient, the step's largest, is written and reduced
  across the devices in float32 (on v5e an all-reduce of the whole table): [V, E] at 4 bytes an element
  instead of 2 (BERT-large's is 125 MB in float32). In float32 compute it is autodiff's.

  The bias's gradient, the float32 logits' gradient summed over x's leading dims, is a matmul with ones:
  on a CPU, XLA's reduction of the [P, V] gradient over P took a quarter of the MLM head's backward pass,
  the matmul a fraction of it (docs/performance.md).

  `library` (`model.matmuls` "library"): the gradients' two products in the forms XLA:CPU runs on its
  matrix library (`library_matmul`); the same products.
  """
  # The leading dims as one: XLA:CPU ran the 3-D einsums' backward pass 20% slower (docs/performance.md).
  logits = jnp.einsum("pe,ve->pv", _rows(x_PE), table_VE, preferred_element_type=jnp.float32)
  return (logits + bias_V.astype(jnp.float32)).reshape(*x_PE.shape[:-1], table_VE.shape[0])


def _rows(a):
  """[..., D] -> [N, D]."""
  return a.reshape(-1, a.shape[-1])


def _tied_logits_forward(x_PE, table_VE, bias_V, library):
  return tied_logits(x_PE, table_VE, bias_V, library), (x_PE, table_VE, bias_V)


def _tied_logits_backward(library, residuals, d_logits):
  x_PE, table_VE, bias_V = residuals
  d_logits = _rows(d_logits)
  # At full float32 precision: a TPU's default would round the gradient to bfloat16 for its matrix unit.
  d_bias = jnp.einsum("pv,p->v", d_logits, jnp.ones(d_logits.shape[:1], d_logits.dtype),
                      precision=jax.lax.Precision.HIGHEST).astype(bias_V.dtype)
  d_logits = d_logits.astype(x_PE.dtype)
  if library:
    d_x = library_matmul.einsum("pv,ve->pe", d_logits, table_VE, x_PE.dtype).reshape(x_PE.shape)
    d_table = library_matmul.rows_transposed_product(d_logits, _rows(x_PE), table_VE.dtype)
    return d_x, d_table, d_bias
  d_x = jnp.einsum("pv,ve->pe", d_logits, table_VE).reshape(x_PE.shape)
  d_table = jnp.einsum("pv,pe->ve", d_logits, _rows(x_PE))   # summed over x's leading dims
  return d_x, d_table, d_bias


tied_logits.defvjp(_tied_logits_forward, _tied_logits_backward)

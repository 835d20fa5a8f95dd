"""bert_jax: BERT-family encoders in JAX/Flax, TPU-first.

The Python API (bert_jax/api.py) is here too, imported on first use so that `import bert_jax` stays
light and the commands configure the environment before JAX loads:

    model = bert_jax.load("path/to/checkpoint")      # .encode(texts), .fill_mask(text), .predict(texts)
    metrics, model = bert_jax.fit("path/to/checkpoint", train=(texts, labels), workdir="runs/mine")
"""

__version__ = "0.1.0"
_API = ("load", "fit", "Model", "Finetuned")


def __getattr__(name):
  if name in _API:
    from bert_jax import api  # pylint: disable=g-import-not-at-top
    return getattr(api, name)
  raise AttributeError(f"module 'bert_jax' has no attribute {name!r}")


def __dir__():
  return sorted(list(globals()) + list(_API))

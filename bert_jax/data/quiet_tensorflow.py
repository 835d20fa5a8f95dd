"""Importing this module imports TensorFlow (and tensorflow_text) quietly, through `host_env`.

For module-name lists such as a multiprocessing forkserver's preload (bert_jax/data/prepare.py), where
TensorFlow imported directly would print its start-up lines from every server process.
"""

from bert_jax import host_env

host_env.import_tensorflow()
import tensorflow_text  # noqa: E402,F401  pylint: disable=g-import-not-at-top,unused-import,wrong-import-position

"""`bench train --compare`: medians and ratios, peers that are not installed, and a step without TensorFlow.

The comparison with the real peers is a benchmark (`bert-jax bench train --compare`), not a test.
"""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from bert_jax.tools import bench_compare, bench_peers, bench_train
from configs import tiny
from tests.conftest import REPO_ROOT


def test_summarize_takes_medians_and_divides_them():
  times = {"bert_jax": [1.0, 3.0, 2.0], "peer": [4.0, 10.0, 4.0], "slow": [8.0, 1.0, 9.0]}
  result = bench_compare.summarize(times, tokens_per_step=100)
  ours, peer = result["systems"]["bert_jax"], result["systems"]["peer"]
  assert (ours["step_seconds_median"], peer["step_seconds_median"]) == (2.0, 4.0)
  assert (ours["tokens_per_second_median"], peer["tokens_per_second_median"]) == (50.0, 25.0)
  # ours / peer in tokens/s: > 1 where ours is faster.
  assert result["tokens_per_second_ratio"] == {"bert_jax/peer": 2.0, "bert_jax/slow": 4.0}


def test_the_ratio_interval_pairs_each_rounds_steps():
  # The machine's speed moves both systems' steps each round; the peer always takes twice ours. Paired by
  # round, every resample gives 2.0; drawn apart, the ratios would spread from 0.2 to 20.
  ours = [0.1, 1.0, 0.3, 0.5, 0.2, 0.8, 0.4, 0.6]
  assert bench_compare.ratio_interval(ours, [2 * t for t in ours]) == pytest.approx([2.0, 2.0])
  noisy = [t * f for t, f in zip(ours, (1.9, 2.2, 1.8, 2.1, 2.0, 2.3, 1.7, 2.05))]
  low, high = bench_compare.ratio_interval(ours, noisy)
  assert 1.7 <= low < 2.0 < high <= 2.3
  assert bench_compare.ratio_interval(ours, noisy, level=0.5)[1] <= high   # a narrower level, a narrower interval
  assert bench_compare.ratio_interval(ours, noisy[:-1]) is None   # a peer that stopped part-way


def test_summarize_gives_each_ratio_its_interval():
  times = {"bert_jax": [1.0, 3.0, 2.0], "peer": [2.0, 6.0, 4.0]}
  result = bench_compare.summarize(times, tokens_per_step=100)
  assert result["tokens_per_second_ratio_interval"] == {"bert_jax/peer": pytest.approx([2.0, 2.0])}


def test_alternate_takes_turns():
  calls = []
  steps = {name: (lambda n=name: calls.append(n) or 1.0) for name in ("ours", "a", "b")}
  times = bench_compare.alternate(steps, rounds=4)
  assert calls == ["ours", "a", "b", "a", "b", "ours", "b", "ours", "a", "ours", "a", "b"]
  assert times == {"ours": [1.0] * 4, "a": [1.0] * 4, "b": [1.0] * 4}


def _config():
  c = tiny.get_config()
  c.global_batch_size = 8
  return c


def test_peers_that_are_not_installed_are_reported_and_skipped(tmp_path, monkeypatch):
  # Modules that fail to import as absent packages do, ahead of any installed peer.
  for module in ("transformers", "keras_hub", "torch"):
    (tmp_path / f"{module}.py").write_text(f"raise ModuleNotFoundError(\"No module named '{module}'\")\n")
  monkeypatch.setenv("PYTHONPATH", str(tmp_path))
  config = _config()
  result = bench_compare.compare(config, bench_train.synthetic_batch(config), lambda: 0.5, steps=3)
  systems = result["systems"]
  assert systems["bert_jax"]["step_seconds"] == [0.5] * 3 and result["tokens_per_second_ratio"] == {}
  for peer in bench_peers.PEERS:
    assert list(systems[peer]) == ["status"]   # no timings
    assert systems[peer]["status"].startswith("not installed: No module named"), systems[peer]


def test_a_missing_peer_python_is_reported(tmp_path):
  config = _config()
  result = bench_compare.compare(config, bench_train.synthetic_batch(config), lambda: 0.5, steps=1,
                                 peer_python=str(tmp_path / "no-python"))
  for peer in bench_peers.PEERS:
    assert result["systems"][peer]["status"].startswith("not installed: ")


def test_compare_refuses_what_the_peers_cannot_run():
  config = _config()
  config.data.packing = True
  with pytest.raises(ValueError, match="unpacked"):
    bench_compare.peer_spec(config, "batch.npz", warmup=1)
  config = _config()
  config.optimizer.schedule = "wsd"
  with pytest.raises(ValueError, match="linear schedule"):
    bench_compare.peer_spec(config, "batch.npz", warmup=1)
  config = _config()
  config.mlm_all_positions = True
  with pytest.raises(ValueError, match="mlm_all_positions"):
    bench_compare.peer_spec(config, "batch.npz", warmup=1)


def test_the_comparison_model_computes_in_the_peers_dtype(tmp_path):
  config = bench_train.comparison_config(packing=False)
  spec = bench_compare.peer_spec(config, str(tmp_path / "batch.npz"), warmup=1)
  assert spec["dtype"] == "float32" and not bench_peers._bfloat16(spec)
  assert bench_peers._precision(spec) == []   # no precision difference left to report
  assert config.model.matmuls == "xla"
  # bfloat16: the peers in their own mixed precision; on a CPU our matmuls in the library's forms.
  config = bench_train.comparison_config(packing=False, dtype="bfloat16")
  spec = bench_compare.peer_spec(config, str(tmp_path / "batch.npz"), warmup=1)
  assert spec["dtype"] == "bfloat16" and bench_peers._bfloat16(spec) and bench_peers._precision(spec) == []
  assert config.model.matmuls == ("library" if jax.default_backend() == "cpu" else "xla")
  assert bench_peers._precision(spec | {"dtype": "float16"}) == ["float32 compute (bert_jax: float16)"]
  # BERT's tanh GELU, which KerasHub's BertBackbone has and the spec hands to Hugging Face's BertConfig.
  assert spec["model"]["hidden_act"] == "gelu_new" and "gelu_new" in bench_peers._TANH_GELUS


def _peer_python() -> str:
  """An interpreter with transformers<5's Flax models: BERT_JAX_PEER_PYTHON, or this one where it has them."""
  if python := os.environ.get("BERT_JAX_PEER_PYTHON"):
    return python
  try:
    import transformers  # pylint: disable=g-import-not-at-top
  except ImportError:
    pytest.skip("no transformers here; BERT_JAX_PEER_PYTHON names an interpreter that has it")
  if int(transformers.__version__.split(".")[0]) >= 5:
    pytest.skip("transformers 5 has no Flax models")
  return sys.executable


@pytest.mark.slow
def test_hugging_face_flax_at_the_masked_positions_has_the_same_losses(tmp_path):
  # The masked peer applies Hugging Face's own encoder and heads, the MLM head on the masked rows only: the
  # same parameters, dropout masks and losses as the whole-sequence head, less work. Through the peers'
  # protocol, as `--compare` runs them.
  python = _peer_python()
  config = _config()
  np.savez(tmp_path / "batch.npz", **bench_train.synthetic_batch(config))
  for dropout in (0.1, 0.0):
    spec = bench_compare.peer_spec(config, str(tmp_path / "batch.npz"), warmup=0)
    spec["model"]["hidden_dropout"] = spec["model"]["attention_dropout"] = dropout
    losses = {}
    for name in ("hugging_face_flax", "hugging_face_flax_masked"):
      peer = bench_compare.Peer(name, python, spec, str(tmp_path))
      try:
        assert peer.status == "ready", peer.info
        logits = "the masked" if name.endswith("masked") else "every"
        assert any(f"MLM logits at {logits}" in d for d in peer.info["differences"])
        losses[name] = [peer._request({"steps": 1})["loss"] for _ in range(3)]
      finally:
        peer.close()
    assert losses["hugging_face_flax"] == pytest.approx(losses["hugging_face_flax_masked"], rel=1e-5)
  # Without dropout a loss moves only by training: the first step's learning rate is 0 (warmup from 0).
  assert losses["hugging_face_flax"][0] == losses["hugging_face_flax"][1] != losses["hugging_face_flax"][2]


# TensorFlow is only the data library: the model, the steps and `bench train` run without it (a GPU image
# may not have it). Any import of it fails in this process.
_WITHOUT_TENSORFLOW = """
import sys

class NoTensorFlow:
  def find_spec(self, name, path=None, target=None):
    if name.split(".")[0] in ("tensorflow", "tensorflow_text", "tensorflow_datasets"):
      raise ImportError(f"{name} is blocked")

sys.meta_path.insert(0, NoTensorFlow())
import bert_jax.models, bert_jax.steps
from bert_jax import cli
try:
  cli.main(["bert-jax", "bench", "train", "--config=configs/tiny.py", "--steps=1", "--dropout_bits=hash"])
except SystemExit as e:
  assert not e.code, e.code
assert not [m for m in sys.modules if m.startswith("tensorflow")]
"""


@pytest.mark.slow
def test_bench_train_runs_without_tensorflow():
  env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), XLA_FLAGS="")   # this tree's bert_jax; one device
  proc = subprocess.run([sys.executable, "-c", _WITHOUT_TENSORFLOW], cwd=REPO_ROOT, env=env, capture_output=True,
                        text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert '"tokens_per_second"' in proc.stdout
  assert '"dropout_bits": "hash"' in proc.stdout   # --dropout_bits reached the model

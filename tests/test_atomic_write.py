"""atomic_write.replacing: the file is the old one or the whole new one, and no temporary is left."""

import os

import pytest

from bert_jax import atomic_write


def test_replacing_moves_the_whole_file_into_place_and_keeps_the_old_one_on_error(tmp_path):
  path = str(tmp_path / "results.md")
  with atomic_write.replacing(path) as tmp, open(tmp, "w") as f:
    f.write("first")
    assert not os.path.exists(path)   # nothing at `path` until the block ends
  with pytest.raises(RuntimeError):
    with atomic_write.replacing(path) as tmp, open(tmp, "w") as f:
      f.write("half of the sec")
      raise RuntimeError("killed")
  with open(path) as f:
    assert f.read() == "first"
  assert os.listdir(tmp_path) == ["results.md"]

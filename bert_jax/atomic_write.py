"""Files that are either absent or whole: written under a temporary name, then moved onto their own.

Markers of finished work (an ablation's stages, a sweep's trials) and tables that several processes
sharing a workdir rewrite all go through here; a kill or a second writer never leaves a torn file.
"""

import contextlib
import os


@contextlib.contextmanager
def replacing(path: str):
  """A temporary name beside `path` (this process's own), moved onto `path` when the block ends without
  an error; removed when it raises."""
  tmp = f"{path}.{os.getpid()}.tmp"
  try:
    yield tmp
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)

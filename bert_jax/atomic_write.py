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


def create_once(path: str, text: str) -> bool:
  """Writes `text` to `path` whole unless `path` exists; True if this call made it. Of two processes
  creating it at once, one wins and the other sees its file (a hard link of a whole temporary file; where
  the file system has no hard links, a rename after a check, which two processes can still race)."""
  tmp = f"{path}.{os.getpid()}.tmp"
  try:
    with open(tmp, "w") as f:
      f.write(text)
    try:
      os.link(tmp, path)
    except FileExistsError:
      return False
    except OSError:
      if os.path.exists(path):
        return False
      os.replace(tmp, path)
    return True
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)

"""Makes config files importable before absl parses `--config` (which executes the file).

Config files do `from configs import common` (or `from configs.finetune import ...`), so the directory
holding the `configs` package must be on `sys.path`. Command entry points call this at import, before
they define their flags; it defines none itself, so every entry point can share it.
"""

import os
import sys


def put_config_root_on_path(argv: list[str]) -> None:
  """Puts the parent of the `configs/` directory holding the `--config` file, then the cwd, first
  on `sys.path` (`--config=FILE[:arg]` or `--config FILE[:arg]`)."""
  roots = []
  for i, arg in enumerate(argv):
    value = arg.split("=", 1)[1] if arg.startswith("--config=") else (
        argv[i + 1] if arg == "--config" and i + 1 < len(argv) else None)
    if value:
      roots.append(_configs_parent(os.path.abspath(value.split(":", 1)[0])))
  roots.append(os.getcwd())
  sys.path[:0] = [r for r in dict.fromkeys(roots) if r and r not in sys.path]


def put_shipped_configs_first() -> None:
  """Puts the clone that holds this package first on `sys.path`, for the configs it ships that a command
  reads without `--config` (`bench train`'s comparison model, `api.finetune`'s generic task): from any
  directory, also one holding a `configs` package of its own."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  if not os.path.isfile(os.path.join(root, "configs", "common.py")):
    raise FileNotFoundError(f"the configs/ this package ships are not beside it in {root}: install it from a "
                            "clone (`pip install -e .`, as the README does)")
  if root in sys.path:
    sys.path.remove(root)
  sys.path.insert(0, root)


def _configs_parent(path: str) -> str | None:
  """The parent of the nearest enclosing directory named `configs` (configs/x.py, configs/finetune/x.py)."""
  directory = os.path.dirname(path)
  while os.path.dirname(directory) != directory:
    if os.path.basename(directory) == "configs":
      return os.path.dirname(directory)
    directory = os.path.dirname(directory)
  return None

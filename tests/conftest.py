"""Test setup: 8 fake CPU devices, so every sharding is exercised on one host.

The flag must be set before jax is imported anywhere, hence here, at the top.
"""

import os
import pathlib

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402

SHARED_DATA = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"
REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


def shared_path(*parts: str) -> pathlib.Path:
  """A path under ../shared/data; the calling test is skipped when it is absent."""
  path = SHARED_DATA.joinpath(*parts)
  if not path.exists():
    pytest.skip(f"{path} not available (real-data test)")
  return path

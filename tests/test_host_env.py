"""The process environment of a command: the malloc a compiling command runs with (`host_env`)."""

import os
import subprocess
import sys

import pytest

from bert_jax import host_env

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINUX = sys.platform.startswith("linux")


def _finder(installed: dict[str, list[str]]):
  return lambda name: installed.get(name, [])


@pytest.mark.skipif(not LINUX, reason="LD_PRELOAD is the Linux dynamic loader's")
def test_the_first_installed_allocator_is_preloaded_before_the_users_own_preloads(monkeypatch):
  monkeypatch.setattr(host_env, "allocator_in_use", lambda: "system")
  env = {"PATH": "/bin", "LD_PRELOAD": "libmine.so"}
  installed = {"tcmalloc": ["libtcmalloc_minimal.so.4"], "tbbmalloc": ["/v/lib/libtbbmalloc.so.2", "/v/lib/proxy.so"]}
  new = host_env.allocator_preload(env, _finder(installed))
  assert new["LD_PRELOAD"] == "libtcmalloc_minimal.so.4 libmine.so" and new["PATH"] == "/bin"
  assert env == {"PATH": "/bin", "LD_PRELOAD": "libmine.so"}   # the caller's mapping is left as it was
  # The re-executed process has the mark: it never runs itself again, whatever it finds.
  assert host_env.allocator_preload(new, _finder(installed)) is None
  # Named: that one, its libraries in order; not installed: none.
  chosen = host_env.allocator_preload({host_env.ALLOCATOR_VARIABLE: "tbbmalloc"}, _finder(installed))
  assert chosen["LD_PRELOAD"] == "/v/lib/libtbbmalloc.so.2 /v/lib/proxy.so"
  assert host_env.allocator_preload({host_env.ALLOCATOR_VARIABLE: "jemalloc"}, _finder(installed)) is None
  assert host_env.allocator_preload({}, _finder({})) is None


def test_no_preload_when_told_so_or_one_runs_already(monkeypatch):
  installed = _finder({"jemalloc": ["libjemalloc.so.2"]})
  assert host_env.allocator_preload({host_env.ALLOCATOR_VARIABLE: "system"}, installed) is None
  with pytest.raises(ValueError, match="BERT_JAX_MALLOC='mimalloc'"):
    monkeypatch.setattr(sys, "platform", "linux")
    host_env.allocator_preload({host_env.ALLOCATOR_VARIABLE: "mimalloc"}, installed)
  monkeypatch.setattr(host_env, "allocator_in_use", lambda: "tcmalloc")   # e.g. the user's own LD_PRELOAD
  assert host_env.allocator_preload({}, installed) is None
  monkeypatch.setattr(sys, "platform", "darwin")
  monkeypatch.setattr(host_env, "allocator_in_use", lambda: "system")
  assert host_env.allocator_preload({}, installed) is None


def test_the_allocator_in_use_is_read_from_the_process_mappings(tmp_path):
  maps = tmp_path / "maps"
  maps.write_text("7f00-7f01 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n")
  assert host_env.allocator_in_use(str(maps)) == "system"
  maps.write_text(maps.read_text() + "7f02-7f03 r-xp 0 08:01 2 /usr/lib/x86_64-linux-gnu/libjemalloc.so.2\n")
  assert host_env.allocator_in_use(str(maps)) == "jemalloc"
  assert host_env.allocator_in_use(str(tmp_path / "absent")) == "system"


def _installed() -> list[str]:
  return [name for name, find in host_env.ALLOCATORS.items() if find()]


@pytest.mark.skipif(not LINUX or not _installed(), reason="no allocator of host_env.ALLOCATORS is installed")
def test_a_compiling_command_runs_again_as_the_same_process_with_the_allocator():
  code = ("import os; from bert_jax import host_env; print(os.getpid(), host_env.allocator_in_use(), flush=True); "
          "host_env.reexec_with_allocator(); print('went on')")
  env = {k: v for k, v in os.environ.items() if k not in (host_env.ALLOCATOR_VARIABLE, "LD_PRELOAD")}
  proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                        timeout=120)
  assert proc.returncode == 0, proc.stderr
  (pid, before), (again, after), went_on = [line.split() for line in proc.stdout.splitlines()]
  assert pid == again and before == "system" and after == _installed()[0] and went_on == ["went", "on"]
  # Told to keep the C library's: it runs once, as it is.
  proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                        env={**env, host_env.ALLOCATOR_VARIABLE: "system"})
  assert [line.split()[1:] for line in proc.stdout.splitlines()] == [["system"], ["on"]]

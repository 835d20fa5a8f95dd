"""The malloc a command runs with (`malloc.py`): which one, for which command, and run again with it."""

import os
import subprocess
import sys

import pytest

from bert_jax import cli, host_env, malloc

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINUX = sys.platform.startswith("linux")


def _finder(installed: dict[str, list[str]]):
  return lambda name: installed.get(name)


def test_which_allocators_help_which_command():
  compiling = {"jemalloc": {}, "tcmalloc": {}, "tbbmalloc": {}}
  assert malloc.candidates("aot", accelerator=False) == malloc.candidates("aot", accelerator=True) == compiling
  assert list(compiling) == list(malloc.candidates("aot", accelerator=False))   # best first
  # A train step wants freed pages kept for the next step (TBB's hands them back); measured on CPU hosts only.
  stepping = {"jemalloc": {"MALLOC_CONF": "dirty_decay_ms:-1,muzzy_decay_ms:-1"}, "tcmalloc": {}}
  assert malloc.candidates("pretrain", accelerator=False) == malloc.candidates("bench train", False) == stepping
  assert list(malloc.candidates("pretrain", accelerator=False)) == ["jemalloc", "tcmalloc"]
  assert malloc.candidates("pretrain", accelerator=True) == {} == malloc.candidates("embed", accelerator=False)


@pytest.mark.skipif(not LINUX, reason="LD_PRELOAD is the Linux dynamic loader's")
def test_the_first_installed_allocator_is_preloaded(monkeypatch):
  monkeypatch.setattr(malloc, "in_use", lambda: "system")
  env = {"PATH": "/bin"}
  installed = {"tcmalloc": ["libtcmalloc_minimal.so.4"], "tbbmalloc": ["/v/lib/libtbbmalloc.so.2", "/v/lib/proxy.so"],
               "jemalloc": ["libjemalloc.so.2"]}
  new = malloc.preload(env, {"tcmalloc": {}, "tbbmalloc": {}}, _finder(installed))
  assert new["LD_PRELOAD"] == "libtcmalloc_minimal.so.4" and new["PATH"] == "/bin"
  assert env == {"PATH": "/bin"}   # the caller's mapping is left as it was
  # The user's own preload (a sanitizer or a profiler that must come first, or another malloc): left alone.
  assert malloc.preload({"LD_PRELOAD": "libasan.so.8"}, {"tcmalloc": {}}, _finder(installed)) is None
  # The process run again has the mark: it never runs itself again, whatever it finds.
  assert malloc.preload(new, {"tcmalloc": {}}, _finder(installed)) is None
  # A choice's environment defaults come with it, unless the user's own environment says otherwise.
  keep = {"jemalloc": {"MALLOC_CONF": "dirty_decay_ms:-1"}}
  assert malloc.preload({}, keep, _finder(installed))["MALLOC_CONF"] == "dirty_decay_ms:-1"
  assert malloc.preload({"MALLOC_CONF": "narenas:1"}, keep, _finder(installed))["MALLOC_CONF"] == "narenas:1"
  assert "MALLOC_CONF" not in malloc.preload({}, {"jemalloc": {}}, _finder(installed))
  # Named: that one, its libraries in order (with no defaults where the command's choices lack it); not
  # installed: none.
  chosen = malloc.preload({malloc.VARIABLE: "tbbmalloc"}, keep, _finder(installed))
  assert chosen["LD_PRELOAD"] == "/v/lib/libtbbmalloc.so.2 /v/lib/proxy.so" and "MALLOC_CONF" not in chosen
  assert malloc.preload({malloc.VARIABLE: "jemalloc"}, keep, _finder({})) is None
  assert malloc.preload({}, {"jemalloc": {}, "tcmalloc": {}}, _finder({"tbbmalloc": ["x.so"]})) is None
  # glibc's own malloc in huge pages: nothing to preload, a tunable added to the user's own.
  huge = _finder({"glibc-huge-pages": []})
  new = malloc.preload({"GLIBC_TUNABLES": "glibc.malloc.tcache_count=0"}, {"glibc-huge-pages": {}}, huge)
  assert new["GLIBC_TUNABLES"] == "glibc.malloc.tcache_count=0:glibc.malloc.hugetlb=1" and "LD_PRELOAD" not in new
  new = malloc.preload({}, {"jemalloc": {}, "glibc-huge-pages": {}}, huge)
  assert new["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
  # It is taken where named only.
  assert malloc.preload({}, malloc.candidates("pretrain", accelerator=False), huge) is None
  new = malloc.preload({malloc.VARIABLE: "glibc-huge-pages"}, malloc.candidates("pretrain", False), huge)
  assert new["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1" and new[malloc._MARK] == "glibc-huge-pages"


def test_no_preload_when_told_so_or_one_runs_already(monkeypatch):
  installed = _finder({"jemalloc": ["libjemalloc.so.2"]})
  monkeypatch.setattr(sys, "platform", "linux")
  monkeypatch.setattr(malloc, "in_use", lambda: "system")
  choices = {"jemalloc": {}}
  assert malloc.preload({malloc.VARIABLE: "system"}, choices, installed) is None
  with pytest.raises(ValueError, match="BERT_JAX_MALLOC='mimalloc': one of jemalloc, tcmalloc"):
    malloc.preload({malloc.VARIABLE: "mimalloc"}, choices, installed)
  monkeypatch.setattr(malloc, "in_use", lambda: "tcmalloc")   # e.g. the user's own LD_PRELOAD
  assert malloc.preload({}, choices, installed) is None
  monkeypatch.setattr(sys, "platform", "darwin")
  monkeypatch.setattr(malloc, "in_use", lambda: "system")
  assert malloc.preload({}, choices, installed) is None


def test_the_allocator_in_use_is_read_from_the_process_mappings(tmp_path):
  maps = tmp_path / "maps"
  maps.write_text("7f00-7f01 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n")
  assert malloc.in_use(str(maps)) == "system"
  maps.write_text(maps.read_text() + "7f02-7f03 r-xp 0 08:01 2 /usr/lib/x86_64-linux-gnu/libjemalloc.so.2\n")
  assert malloc.in_use(str(maps)) == "jemalloc"
  assert malloc.in_use(str(tmp_path / "absent")) == "system"


def test_glibcs_huge_pages_are_read_from_its_tunables(tmp_path, monkeypatch):
  maps = tmp_path / "maps"
  maps.write_text("7f00-7f01 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n")
  monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.tcache_count=0:glibc.malloc.hugetlb=1")
  assert malloc.in_use(str(maps)) == "glibc-huge-pages"
  monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=0")
  assert malloc.in_use(str(maps)) == "system"


def _clean_environment() -> dict[str, str]:
  drop = (malloc.VARIABLE, malloc._MARK, "LD_PRELOAD", "GLIBC_TUNABLES", "MALLOC_CONF")
  return {k: v for k, v in os.environ.items() if k not in drop}


def installed(names=tuple(malloc.COMMANDS["aot"])) -> list[str]:
  """The allocators of `names` (those `bert-jax aot` takes) this machine has, best first."""
  return [name for name in names if LINUX and malloc.ALLOCATORS[name][0]() is not None]


@pytest.mark.parametrize("command", ["aot", "pretrain"])
def test_a_command_runs_again_as_the_same_process_with_the_allocator(command):
  if not (helps := installed(tuple(malloc.candidates(command, accelerator=False)))):
    pytest.skip(f"no allocator that helps {command} is installed")
  code = ("import os; from bert_jax import malloc; print(os.getpid(), malloc.in_use(), flush=True); "
          f"malloc.reexec({command!r}, accelerator=False); print(os.getpid(), 'went on')")
  env = _clean_environment()
  proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                        timeout=120)
  assert proc.returncode == 0, proc.stderr
  lines = [line.split(" ", 1) for line in proc.stdout.splitlines()]
  assert lines == [[lines[0][0], "system"], [lines[0][0], helps[0]], [lines[0][0], "went on"]]
  # Told to keep the C library's, or a command no allocator helps: it runs once, as it is.
  for extra, other in (({malloc.VARIABLE: "system"}, command), ({}, "embed")):
    proc = subprocess.run([sys.executable, "-c", code.replace(repr(command), repr(other))], cwd=REPO_ROOT,
                          env={**env, **extra}, capture_output=True, text=True, timeout=120)
    assert [line.split(" ", 1)[1] for line in proc.stdout.splitlines()] == ["system", "went on"], proc.stderr


@pytest.mark.skipif(not installed(), reason="no allocator of malloc.ALLOCATORS is installed")
def test_a_peer_of_bench_train_reports_the_malloc_it_inherited():
  # `bench train --compare`'s peers run bench_peers.py by its path in their own environment, inheriting ours.
  env = malloc.preload(_clean_environment(), malloc.COMMANDS["aot"])
  if env is None:
    pytest.skip("this process already runs with an allocator of malloc.ALLOCATORS")
  code = "import sys; sys.path.insert(0, 'bert_jax/tools'); import bench_peers; print(bench_peers._allocator())"
  for environ, expected in ((env, installed()[0]), ({**env, "LD_PRELOAD": ""}, "system")):
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=environ, capture_output=True, text=True,
                          timeout=120)
    assert proc.stdout.split() == [expected], proc.stderr


class _Stop(Exception):
  pass


def test_only_the_process_own_command_line_is_run_again(monkeypatch):
  """A program that sets sys.argv and calls `cli.main()` (or a test) is not run again from its own start."""
  calls = []
  monkeypatch.setattr(malloc, "reexec", lambda command, accelerator: calls.append(command))
  monkeypatch.setattr(host_env, "configure", lambda: (_ for _ in ()).throw(_Stop()))   # stop right after
  monkeypatch.setattr(sys, "argv", ["bert-jax", "aot", "--topology=v4:2x2x1"])
  with pytest.raises(_Stop):
    cli.main()   # sys.orig_argv is pytest's
  with pytest.raises(_Stop):
    cli.main(["bert-jax", "aot"])
  assert calls == []
  monkeypatch.setattr(sys, "orig_argv", [sys.executable, "/venv/bin/bert-jax", "aot", "--topology=v4:2x2x1"])
  with pytest.raises(_Stop):
    cli.main()
  assert calls == ["aot"]


def test_a_malloc_that_is_no_allocator_is_one_line_and_exit_2():
  proc = subprocess.run([sys.executable, "-m", "bert_jax.cli", "aot", "--helpshort"], cwd=REPO_ROOT,
                        env={**_clean_environment(), malloc.VARIABLE: "mimalloc"}, capture_output=True, text=True,
                        timeout=120)
  assert proc.returncode == 2 and proc.stderr.splitlines() == [
      "bert-jax aot: BERT_JAX_MALLOC='mimalloc': one of jemalloc, tcmalloc, tbbmalloc, glibc-huge-pages or system"]

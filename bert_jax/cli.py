"""The `bert-jax` command: one subcommand per module, imported lazily.

Each subcommand module defines its own absl flags (at import, or in `define_flags()` when other code
imports it as a library) and a `main(argv)`; only the chosen one is imported, so flags of different
subcommands never collide.
"""

import functools
import importlib
import sys

SUBCOMMANDS = {
    "pretrain": ("bert_jax.main", "Pretrain from a config (--config=configs/x.py[:arg] --workdir=DIR)."),
    "aot": ("bert_jax.tools.aot", "Compile the train step ahead of time for a TPU topology; report memory and time."),
    "embed": ("bert_jax.tools.embed", "Write every layer's hidden states for JSON-lines input to an .npz file."),
    "fill-mask": ("bert_jax.tools.fill_mask", "Print the most likely tokens at each [MASK] of texts (MLM head)."),
    "prepare": ("bert_jax.data.prepare", "Tokenize a corpus into sharded files for pretraining."),
    "finetune": ("bert_jax.finetune.main", "Finetune on a task (--config=configs/finetune/x.py)."),
    "sweep": ("bert_jax.finetune.sweep", "Hyperparameter sweep over finetuning runs with a results table."),
    "ablate": ("bert_jax.ablate.main", "Rerun a paper's ablation table against its numbers (--config=configs/ablations/x.py:small)."),
    "predict": ("bert_jax.tools.predict", "Run a finetuned workdir on new text (JSONL/TSV/CSV): labels, values, tags, spans."),
    "export": ("bert_jax.interop.export", "Write a checkpoint as a Hugging Face directory (finetuned: its head's class)."),
    "bench data": ("bert_jax.tools.bench_data", "Benchmark the input pipeline and `prepare`; prints JSON lines."),
    "bench train": ("bert_jax.tools.bench_train", "Benchmark the train step (step time, tokens/s, MFU); prints JSON."),
    "bench kernel": ("bert_jax.tools.bench_kernel", "The TPU compiler's schedule of the flash attention kernels "
                     "or of LayerNorm's backward kernel (bundles per grid step); prints JSON lines."),
    "analyze attention": ("bert_jax.analysis.attention", "Attention maps of every layer and head: PNG grids, "
                          "BertViz-style HTML pages."),
    "analyze heads": ("bert_jax.analysis.heads", "Per-head attention statistics over a corpus: CSV, heat maps."),
    "analyze prune": ("bert_jax.analysis.prune", "Head importance of a finetuned model, the pruning curve, a "
                      "pruned export."),
    "analyze probe": ("bert_jax.analysis.probe", "Linear/MLP probes on every layer's frozen features; per-layer "
                      "accuracy curves."),
}
_TWO_WORD = ("bench", "analyze")  # `bench data`, `analyze heads`, ...


def _usage(group: str = "") -> str:
  """The commands (those of `group`, "bench" or "analyze", where given) and what each does."""
  lines = [f"usage: bert-jax {group or '<command>'} {'<command> ' if group else ''}[flags]", "", "commands:"]
  prefix = f"{group} " if group else ""
  lines += [f"  {name:<18} {doc}" for name, (_, doc) in SUBCOMMANDS.items() if name.startswith(prefix)]
  lines += ["", "`bert-jax <command> --help` lists a command's flags."]
  return "\n".join(lines)


def main(argv=None) -> None:
  # The process's own command line (the console script, `python -m bert_jax.cli`), not a caller's argv or a
  # program that set sys.argv and called us: only that one is run again with another malloc.
  from_command_line = argv is None and sys.orig_argv[len(sys.orig_argv) - len(sys.argv) + 1:] == sys.argv[1:]
  argv = list(sys.argv if argv is None else argv)
  if len(argv) < 2 or argv[1] in ("-h", "--help", "help"):
    print(_usage())
    sys.exit(0 if len(argv) >= 2 else 2)
  name, rest = argv[1], argv[2:]
  if name in _TWO_WORD and (not rest or rest[0] in ("-h", "--help", "help")):   # `bert-jax bench --help`
    print(_usage(name))
    sys.exit(0 if rest else 2)
  if name in _TWO_WORD:
    name, rest = f"{name} {rest[0]}", rest[1:]
  if name not in SUBCOMMANDS:
    print(f"bert-jax: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
    sys.exit(2)
  from bert_jax import host_env  # pylint: disable=g-import-not-at-top
  if from_command_line:   # with a faster malloc where one is installed and helps the command
    from bert_jax import malloc  # pylint: disable=g-import-not-at-top
    try:
      malloc.reexec(name, accelerator=host_env.has_accelerator())
    except ValueError as e:   # BERT_JAX_MALLOC names no allocator
      print(f"bert-jax {name}: {e}", file=sys.stderr)
      sys.exit(2)
  host_env.configure()   # before JAX or TensorFlow is imported
  from absl import app, flags  # pylint: disable=g-import-not-at-top
  from bert_jax import config_path  # pylint: disable=g-import-not-at-top

  config_path.put_config_root_on_path(rest)  # configs import `configs.common`, from any working directory

  module = importlib.import_module(SUBCOMMANDS[name][0])
  if hasattr(module, "define_flags"):  # a library module too: its flags exist only when it is the command
    module.define_flags()
  # `--help` describes the key flags of the module named sys.argv[0]: make it the command's flags.
  for flag in flags.FLAGS.get_key_flags_for_module(module):
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
  from bert_jax import config_loading  # pylint: disable=g-import-not-at-top
  prog = f"bert-jax {name}"
  # A misspelt flag or config field is one line and exit 2 in every command, not a traceback.
  app.run(functools.partial(_run, module.main, prog), argv=[prog] + rest,
          flags_parser=functools.partial(config_loading.parse_flags, prog=prog))


def _run(command_main, prog: str, argv) -> None:
  """The command, with library INFO logs (orbax writes dozens per checkpoint) off unless --verbosity; a
  `failures.UserError` (a config, path or data the person can fix) or a usage error (a required flag not given)
  ends it in one paragraph and exit 2 (`--help` lists the flags), a Ctrl-C the command does not handle itself in
  one line and exit 130, not a traceback."""
  from absl import app, flags, logging  # pylint: disable=g-import-not-at-top
  from bert_jax import failures  # pylint: disable=g-import-not-at-top
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  try:
    command_main(argv)
  except failures.UserError as e:
    failures.say_and_exit(e, prefix=prog)
  except app.UsageError as e:   # absl's own handling prints the whole --help before it, and exits 1
    failures.say_and_exit(failures.UserError(f"{e} (--help lists the flags)"), prefix=prog)
  except KeyboardInterrupt:
    print(f"{prog}: stopped by Ctrl-C", file=sys.stderr, flush=True)
    sys.exit(130)


def run_module(command_main, prog: str) -> None:
  """`python -m <a command's module>`: the command as `bert-jax` runs it (a misspelt flag or config field, a usage
  error and a config, path or data mistake each in one paragraph and exit 2; Ctrl-C as exit 130)."""
  from absl import app  # pylint: disable=g-import-not-at-top
  from bert_jax import config_loading  # pylint: disable=g-import-not-at-top
  app.run(functools.partial(_run, command_main, prog),
          flags_parser=functools.partial(config_loading.parse_flags, prog=prog))


if __name__ == "__main__":
  main()

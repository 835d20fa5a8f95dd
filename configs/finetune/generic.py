"""Your own data: single-sentence or sentence-pair classification or regression from TSV, CSV or JSON
lines files with named columns, or token tagging with any tag set from CoNLL-style files (train.* and
dev.* in `data_dir`). Grid of Devlin et al. 2019, A.3.

  bert-jax finetune --config=configs/finetune/generic.py:single --workdir=/tmp/tweets \
      --config.init_checkpoint=/path/to/bert --config.data_dir=/path/to/tweets \
      --config.task_opts.text_a=text --config.task_opts.label=sentiment

Classification labels are the training file's distinct labels, sorted, unless `task_opts.labels` names
them (`--config.task_opts.labels=negative,neutral,positive`: ids in that order); `task_opts.num_labels`,
when set, is checked against their count, and `num_labels=1` is regression. The label set is saved in
the workdir (task.json) for `bert-jax predict` and `bert-jax export`. Variants: `:single` (no text_b),
`:pair` (sentence1, sentence2) and `:tagging`:

  bert-jax finetune --config=configs/finetune/generic.py:tagging --workdir=/tmp/ner \
      --config.init_checkpoint=/path/to/bert --config.data_dir=/path/to/conll_style_files

Tagging files hold a token and its tag on each line (token first, tag in the last column unless
`task_opts.tag_column` says otherwise) and a blank line between sentences; the tag set is the training
file's. Span F1 (conlleval / seqeval) is reported when the tags are BIO, token accuracy always. A cased
checkpoint's tokenizer_config.json says `do_lower_case: false`, which is followed; with a bare cased vocab.txt
add `--config.do_lower_case=false`.
"""

from configs.finetune import common


def get_config(arg: str = "single"):
  c = common.get_config()
  if arg == "tagging":
    c.task = "tagging"
    c.task_opts.tag_column = -1
    c.task_opts.labels = ""
    c.num_epochs = 4
    return c
  c.task = "generic"
  c.task_opts.text_a = "sentence"
  c.task_opts.text_b = "" if arg == "single" else "sentence2"
  c.task_opts.label = "label"
  c.task_opts.labels = ""      # empty: the training file's labels, sorted; or "a,b,c" in id order
  c.task_opts.num_labels = 0   # 0: as many as the labels; 1: regression
  if arg == "pair":
    c.task_opts.text_a = "sentence1"
  elif arg != "single":
    raise ValueError(f"unknown variant {arg!r}; use 'single', 'pair' or 'tagging'")
  return c

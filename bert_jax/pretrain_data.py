"""A pretraining run's data: the embedded corpus prepared into the workdir, the tokenizer checked against the
model, the host-local train and eval iterators (bert_jax/data/input_pipeline.py)."""

import os

import jax
import ml_collections

from bert_jax import atomic_write
from bert_jax import failures
from bert_jax import objectives


def prepared_data_config(config: ml_collections.ConfigDict, workdir: str) -> ml_collections.ConfigDict:
  """`config.data`, with an embedded corpus ("embedded:<name>") prepared into `<workdir>/data` first."""
  d = ml_collections.ConfigDict(config.data.to_dict())
  if not d.train_files.startswith("embedded:"):
    return d
  from bert_jax.data import prepare  # pylint: disable=g-import-not-at-top

  out = os.path.join(workdir, "data")
  done = os.path.join(out, "PREPARED")
  # What the folder is prepared from: the corpus, and `data.vocab_file` where one is given.
  marker = d.train_files + "\n" + (f"vocab_file {d.vocab_file}\n" if d.vocab_file else "")
  if os.path.exists(done):
    with open(done) as f:
      was = f.read()
    if was != marker:
      raise failures.UserError(
          f"{out} was prepared from {_from(was)}, and this run asks for {_from(marker)}: give a new --workdir "
          "for the new data (or set data.train_files and data.vocab_file back)")
  elif jax.process_index() == 0:
    # The corpus is tokenized with `data.vocab_file`, else with a vocabulary of the model's size trained on it;
    # documents are held out for eval.
    vocab_size = None if d.vocab_file else objectives.encoder_config(config).vocab_size
    prepare.prepare_corpus(d.train_files, out, vocab_file=d.vocab_file or None, do_lower_case=d.do_lower_case,
                           train_vocab_size=vocab_size, eval_fraction=d.eval_fraction)
    with atomic_write.replacing(done) as tmp, open(tmp, "w") as f:   # another process reads it whole or not at all
      f.write(marker)
  sync_hosts("prepared data")
  d.train_files = out   # the tokenizer is read from the same directory, or from data.vocab_file
  return d


def _from(marker: str) -> str:
  corpus, _, vocab = marker.partition("\n")
  vocab = vocab.strip().removeprefix("vocab_file ")
  return f"{corpus} with " + (f"data.vocab_file {vocab}" if vocab else "a vocabulary trained on it")


def sync_hosts(name: str) -> None:
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    multihost_utils.sync_global_devices(name)


def load_tokenizer(data_config, config):
  """The data's tokenizer, checked against the model before anything is compiled: an id past the
  embedding table would train on garbage (NaN, or silently clipped rows)."""
  from bert_jax.data import input_pipeline  # pylint: disable=g-import-not-at-top
  tokenizer = input_pipeline.load_tokenizer(data_config)
  vocab_size = objectives.encoder_config(config).vocab_size
  if tokenizer.vocab_size > vocab_size:
    raise failures.UserError(
        f"the tokenizer of {data_config.vocab_file or data_config.train_files!r} has {tokenizer.vocab_size} "
        f"tokens but the model's embedding table has {vocab_size} (model.vocab_size): set "
        f"--config.model.vocab_size={tokenizer.vocab_size} or use the vocabulary the data was prepared with")
  return tokenizer


def create_iterator(data_config, config, split: str, tokenizer=None):
  """The host-local batch iterator of `split`: endless and resumable for "train", the same
  `config.eval_steps` batches on every call for "eval" (bert_jax/data/input_pipeline.py)."""
  from bert_jax.data import input_pipeline  # pylint: disable=g-import-not-at-top
  if split == "eval":
    return input_pipeline.create_eval_iterator(data_config, global_batch_size=config.global_batch_size,
                                               num_batches=config.eval_steps, tokenizer=tokenizer,
                                               objective=config.objective)
  return input_pipeline.create_pretrain_iterator(data_config, global_batch_size=config.global_batch_size,
                                                 tokenizer=tokenizer, objective=config.objective)

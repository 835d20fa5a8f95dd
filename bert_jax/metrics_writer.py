"""The one metrics writer of pretraining and finetuning: stdout, `metrics.jsonl` and TensorBoard.

    writer = MetricWriter(workdir)
    writer.write(step, {"train/loss": 2.3, "eval/accuracy": 0.91})
    writer.close()

Every record goes to `<workdir>/metrics.jsonl` as one JSON object (`{"step": ..., **scalars}`, what
`pandas.read_json(path, lines=True)` reads); its numeric values also go to TensorBoard event files in
`<workdir>/tensorboard` and, with `echo`, to stdout. Only process 0 writes.
"""

import json
import numbers
import os
import shutil

from absl import logging
import jax

from bert_jax import atomic_write
from bert_jax import host_env


JSONL = "metrics.jsonl"


def remove_records(workdir: str) -> bool:
  """Removes what a `MetricWriter` wrote into `workdir` (metrics.jsonl, tensorboard/): a run that starts
  over there writes its records alone, not after those of the run it replaces. Whether there were any."""
  jsonl, events = os.path.join(workdir, JSONL), os.path.join(workdir, "tensorboard")
  found = os.path.exists(jsonl) or os.path.exists(events)
  if os.path.exists(jsonl):
    os.remove(jsonl)
  shutil.rmtree(events, ignore_errors=True)
  return found


def _drop_records_after(path: str, step: int) -> None:
  """metrics.jsonl without its records past `step` (whole lines; a line cut short by a kill goes too)."""
  if not os.path.exists(path):
    return
  with open(path) as f:
    lines = f.readlines()
  kept = []
  for line in lines:
    try:
      if json.loads(line)["step"] <= step:
        kept.append(line if line.endswith("\n") else line + "\n")
    except (ValueError, KeyError, TypeError):
      pass
  if len(kept) < len(lines):
    with atomic_write.replacing(path) as tmp, open(tmp, "w") as f:
      f.writelines(kept)


def _is_scalar(value) -> bool:
  return isinstance(value, numbers.Number) and not isinstance(value, bool)


class MetricWriter:
  """Scalars to stdout (`echo`), `<workdir>/metrics.jsonl` and TensorBoard (`<workdir>/tensorboard`)."""

  def __init__(self, workdir: str, *, echo: bool = True, tensorboard: bool = True, from_step: int | None = None):
    """`from_step`: the step a run starts (or resumes) at; the records of metrics.jsonl past it, logged by the
    same run before it was stopped after its last checkpoint, are dropped: they are logged again."""
    self.enabled = jax.process_index() == 0
    self.echo = echo
    if not self.enabled:
      return
    os.makedirs(workdir, exist_ok=True)
    if from_step is not None:
      _drop_records_after(os.path.join(workdir, JSONL), from_step)
    self._jsonl = open(os.path.join(workdir, JSONL), "a")
    self._summary = None
    if tensorboard:
      try:
        self._tf = host_env.import_tensorflow()
      except ImportError:   # TensorFlow is the data library; a model-only install has none
        logging.warning("TensorFlow is not installed: no TensorBoard events, metrics.jsonl only")
      else:
        self._summary = self._tf.summary.create_file_writer(os.path.join(workdir, "tensorboard"))
        self._metadata = self._tf.compat.v1.SummaryMetadata()
        self._metadata.plugin_data.plugin_name = "scalars"   # what TensorBoard's scalar plugin reads
        self._metadata.data_class = 1                         # DATA_CLASS_SCALAR

  def write(self, step: int, scalars: dict, *, prefix: str = "") -> None:
    """One record at `step`; non-numeric values (e.g. a confusion matrix) go to metrics.jsonl only."""
    if not self.enabled:
      return
    self._jsonl.write(json.dumps({"step": step, **scalars}) + "\n")
    self._jsonl.flush()
    numeric = {k: float(v) for k, v in scalars.items() if _is_scalar(v)}
    if self._summary is not None:
      with self._summary.as_default(step=step):
        for name, value in numeric.items():
          # tf.summary.scalar needs the tensorboard package; this writes the same event it would.
          self._tf.summary.write(name, self._tf.constant(value, self._tf.float32), metadata=self._metadata)
      self._summary.flush()
    shown = ", ".join(f"{k}={v:.4g}" for k, v in numeric.items() if not k.startswith("train/nonfinite"))
    if self.echo and shown:   # a record of no numbers (an event) is the caller's to say in words
      print(f"{prefix}step {step}: {shown}", flush=True)

  def close(self) -> None:
    if self.enabled:
      if self._summary is not None:
        self._summary.close()
      self._jsonl.close()

"""One metrics writer for pretraining and finetuning: stdout, metrics.jsonl and TensorBoard events."""

import json
import os

from bert_jax import host_env
from bert_jax import metrics_writer
from bert_jax.finetune import trainer


def tensorboard_scalars(workdir) -> dict[str, list[tuple[int, float]]]:
  """{tag: [(step, value)]} from the event files in <workdir>/tensorboard."""
  tf = host_env.import_tensorflow()
  out = {}
  directory = os.path.join(workdir, "tensorboard")
  for name in sorted(os.listdir(directory)):
    for event in tf.compat.v1.train.summary_iterator(os.path.join(directory, name)):
      for value in event.summary.value:
        number = float(tf.make_ndarray(value.tensor)) if value.HasField("tensor") else value.simple_value
        out.setdefault(value.tag, []).append((event.step, number))
  return out


def test_writer_sends_numbers_everywhere_and_other_values_to_jsonl_only(tmp_path, capsys):
  writer = metrics_writer.MetricWriter(str(tmp_path))
  writer.write(3, {"train/loss": 2.5, "eval/report": {"a": 1}, "eval/accuracy": 0.75})
  writer.close()
  records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert records == [{"step": 3, "train/loss": 2.5, "eval/report": {"a": 1}, "eval/accuracy": 0.75}]
  assert tensorboard_scalars(tmp_path) == {"train/loss": [(3, 2.5)], "eval/accuracy": [(3, 0.75)]}
  assert "step 3: train/loss=2.5, eval/accuracy=0.75" in capsys.readouterr().out


def test_a_resumed_run_drops_the_records_logged_after_its_checkpoint(tmp_path):
  """Killed after logging step 350 with its last checkpoint at 300, a run resumes at 300 and logs 350 again:
  metrics.jsonl keeps one record a step."""
  writer = metrics_writer.MetricWriter(str(tmp_path), echo=False, tensorboard=False, from_step=0)
  for step in (50, 100, 300, 350):
    writer.write(step, {"train/loss": 1.0})
  writer.close()
  with open(tmp_path / "metrics.jsonl", "a") as f:
    f.write('{"step": 400, "train/lo')   # a line the kill cut short
  writer = metrics_writer.MetricWriter(str(tmp_path), echo=False, tensorboard=False, from_step=300)
  writer.write(350, {"train/loss": 0.5})
  writer.close()
  records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [(r["step"], r["train/loss"]) for r in records] == [(50, 1.0), (100, 1.0), (300, 1.0), (350, 0.5)]


def test_finetuning_logs_through_the_same_writer(tmp_path):
  """The finetuning tracker's evaluations reach TensorBoard too (they used to reach metrics.jsonl only)."""
  tracker = trainer._Tracker(str(tmp_path), "accuracy", patience=0, echo=False)
  tracker.log(10, {"train/loss": 0.5})
  tracker.evaluated(10, {"accuracy": 0.75}, on_best=lambda: None)
  tracker.save()
  assert tensorboard_scalars(tmp_path) == {"train/loss": [(10, 0.5)], "eval/accuracy": [(10, 0.75)]}


def test_a_named_trial_prints_its_lines_after_its_name(tmp_path, capsys):
  tracker = trainer._Tracker(str(tmp_path), "accuracy", patience=0, name="bs16_lr2e-05_ep3_seed0")
  tracker.log(10, {"train/loss": 0.5})
  tracker.save()
  assert capsys.readouterr().out == "[bs16_lr2e-05_ep3_seed0] step 10: train/loss=0.5\n"

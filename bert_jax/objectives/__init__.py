"""Pretraining objectives, one module each; `config.objective` names one.

An objective module owns, for its objective: the batch schema (`batch_schema`: the names, dtypes,
shapes and value ranges that the input pipeline produces, `train_setup.abstract_batch` compiles against and
`bench train` fills), the pretraining model (`build_model`), the loss sums of a batch (`loss_sums`)
and how they combine (`LOSS_TERMS`: term -> coefficient, `loss_weights`), the metrics it reports
(`summarize`), its FLOPs (`forward_flops_per_row`) and what it asks of a config (`validate`). The
loop, sharding, checkpointing, exact resume, AOT and benchmarks call only these.

Every objective writes its loss as sums and weights per term: `<term>_loss_sum`, `<term>_weight`
(`<term>_correct` for accuracy); the loss is sum_t coefficient_t * loss_sum_t / weight_t over the global
batch (base.loss_from_sums), so micro-batches, shards and hosts add up exactly.
"""

import importlib
import pkgutil
from types import ModuleType

from bert_jax.objectives import base

encoder_config = base.encoder_config

# Every module of this package but `base` is an objective: adding one is adding its file.
NAMES = tuple(sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name != "base"))


def get(config_or_name) -> ModuleType:
  """The objective module of a pretraining config (`config.objective`, "bert" when unset) or a name."""
  name = config_or_name if isinstance(config_or_name, str) else config_or_name.get("objective", "bert")
  if name not in NAMES:
    from bert_jax import failures  # pylint: disable=g-import-not-at-top
    raise failures.UserError(f"config.objective {name!r} is not one of {NAMES}")
  return importlib.import_module(f"bert_jax.objectives.{name}")


def encoder_configs(config) -> list:
  """The encoders a pretraining config trains, each a `BertConfig`: its encoder, and the objective's others
  (`other_encoders`, ELECTRA's generator), which the mesh splits by the same rules."""
  return [encoder_config(config)] + list(getattr(get(config), "other_encoders", lambda _: [])(config))


def train_flops_per_step(config) -> float:
  """Model FLOPs of one optimizer step of a train config (all devices, all micro-batches): 3x forward."""
  per_row = get(config).forward_flops_per_row(config)
  return config.global_batch_size * 3.0 * sum(per_row.values())


def kernel_attention_per_row(config) -> dict[str, float]:
  """`flops.kernel_attention_per_row` of one row over every encoder the step trains (ELECTRA's generator
  runs the discriminator's attention kernel too). A frozen teacher is read with XLA's attention."""
  from bert_jax import flops  # pylint: disable=g-import-not-at-top
  total = {"model_flops": 0.0, "flops": 0.0, "bytes": 0.0}
  for cfg in encoder_configs(config):
    for k, v in flops.kernel_attention_per_row(cfg, config.data.seq_length).items():
      total[k] += v
  return total

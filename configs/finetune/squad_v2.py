"""SQuAD v2.0 (Rajpurkar et al. 2018): span extraction with unanswerable questions, EM and F1.

Devlin et al. 2019, Sec. 4.3: 2 epochs, learning rate 5e-5, batch 48; no answer is predicted when the
[CLS] score beats the best span by more than a threshold tuned on dev (`task_opts.null_score_diff_threshold`):

  bert-jax finetune --config=configs/finetune/squad_v2.py --workdir=/tmp/squad2 \
      --config.init_checkpoint=/path/to/bert --config.data_dir=/path/to/squad2
"""

from configs.finetune import squad_v1


def get_config():
  c = squad_v1.get_config()
  c.task = "squad_v2"
  c.task_opts.null_score_diff_threshold = 0.0
  c.batch_size = 48
  c.num_epochs = 2
  c.sweep.grid.batch_size = (48,)
  return c

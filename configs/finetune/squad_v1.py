"""SQuAD v1.1 (Rajpurkar et al. 2016): span extraction, exact match and F1.

Devlin et al. 2019, Sec. 4.2: 3 epochs, learning rate 5e-5, batch 32; sequences of 384 tokens, document
stride 128, questions cut at 64 tokens, answers at most 30 tokens (google-research/bert run_squad.py):

  bert-jax finetune --config=configs/finetune/squad_v1.py --workdir=/tmp/squad \
      --config.init_checkpoint=/path/to/bert --config.data_dir=/path/to/squad
"""

from configs.finetune import common


def get_config():
  c = common.get_config()
  c.task = "squad_v1"
  c.task_opts.doc_stride = 128
  c.task_opts.max_query_length = 64
  c.task_opts.max_answer_length = 30
  c.task_opts.n_best_size = 20
  c.max_seq_length = 384
  c.batch_size = 32
  c.learning_rate = 5e-5
  c.num_epochs = 3
  c.sweep.grid.batch_size = (32,)
  c.sweep.grid.learning_rate = (5e-5, 3e-5)
  c.sweep.grid.num_epochs = (2, 3)
  return c

"""`bert-jax ablate`: a paper's ablation table rerun from a config (runner, statistics, report)."""

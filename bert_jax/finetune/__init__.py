"""Finetuning: tasks and their official metrics (`tasks`, `metrics`, `squad`, `ner`, `readers`), the
finetuning loop and the sweep runner."""

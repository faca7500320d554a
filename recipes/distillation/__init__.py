"""Distillation of gating into a smaller model:
`python -m recipes.distillation --config <file> [--key value ...]`."""

"""Sharing gated models: save/load and the code shipped for `trust_remote_code`, the Hub, model cards.

- `saving`: `save_pretrained` of a patched model (bound to the instance by `patch`), remote code, `auto_map`.
- `loading`: `from_pretrained`, `AutoGatedModel*` (the backend is chosen at load time).
- `tensors`: a checkpoint's tensors, read without building a model.
- `layouts`: gated attention published in other `q_proj` layouts (the paper's checkpoints, Qwen3-Next layers)
  converted to and from ours.
- `hub`: `push_to_hub` with a model card.
- `card`: the model card (README.md) rendered from a checkpoint and the recipe's results.
"""

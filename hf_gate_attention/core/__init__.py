"""The core: what a gate computes and how it attaches to a model instance. Depends on torch + transformers.

- `config`: `GateConfig` (saved with checkpoints).
- `families`: attention layouts as data and the structural search that finds every block of a model
  (`find_attention`), its kind and geometry; `register_family` for the exceptions.
- `gate`: `AttentionGate`, the learned sigmoid gate, and how gate values multiply per-head values.
- `hooks`: the forward hooks that run the gate inside a block (also shipped as `trust_remote_code` code).
- `patching`: `patch` / `unpatch` of one instance, backend choice, `gate_parameters`, the instance methods
  a patch binds (registered from above: `save_pretrained`, `push_to_hub`).
"""

"""From-scratch pretraining study: small Llama-style models, ungated and gated, trained with the Trainer on
an offline English corpus, compared on loss, attention sinks, massive activations and learning-rate
tolerance (`hf-gate-attention recipe pretraining --config recipes/pretraining/configs/study.yaml`)."""

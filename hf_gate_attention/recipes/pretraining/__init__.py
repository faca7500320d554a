"""From-scratch pretraining study: small Llama-style models, ungated and gated, trained with the Trainer on
an offline English corpus, compared on loss, attention sinks, massive activations and learning-rate
tolerance (`python -m recipes.pretraining --config recipes/pretraining/configs/study.yaml`)."""

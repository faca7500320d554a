"""From-scratch pretraining study: `python -m recipes.pretraining --config <file> [--key value ...]`."""

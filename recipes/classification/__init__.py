"""Encoder classification recipe (BERT, ViT):
`python -m recipes.classification --config <file> [--key value ...]`."""

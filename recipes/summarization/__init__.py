"""Long-document summarization recipe: `python -m recipes.summarization --config <file> [--key value ...]`."""

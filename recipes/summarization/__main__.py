"""`python -m recipes.summarization ...` = `hf-gate-attention recipe summarization ...`: kept because
results/REPRODUCTION.md (and the comment of configs/reproduce.yaml) name this command."""

import sys

from hf_gate_attention.cli import main

sys.exit(main(["recipe", "summarization", *sys.argv[1:]]))

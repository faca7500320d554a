"""`python -m hf_gate_attention.recipes.summarization ...` = `hf-gate-attention recipe summarization ...`."""

import sys

from .cli import main

sys.exit(main())

"""`python -m hf_gate_attention.recipes.captioning ...` = `hf-gate-attention recipe captioning ...`."""

import sys

from .cli import main

sys.exit(main())

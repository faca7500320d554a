"""`python -m hf_gate_attention.recipes.classification ...` = `hf-gate-attention recipe classification
...`."""

import sys

from .cli import main

sys.exit(main())

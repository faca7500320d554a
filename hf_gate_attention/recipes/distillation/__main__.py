"""`python -m hf_gate_attention.recipes.distillation ...` = `hf-gate-attention recipe distillation ...`."""

import sys

from .cli import main

sys.exit(main())

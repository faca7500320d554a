"""`python -m hf_gate_attention.recipes.distillation --config <file> [--key value ...]`."""

import sys

from .cli import main

sys.exit(main())

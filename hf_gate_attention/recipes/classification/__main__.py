"""`python -m hf_gate_attention.recipes.classification --config <file> [--key value ...]`."""

import sys

from .cli import main

sys.exit(main())

"""`python -m recipes.summarization --config recipes/summarization/configs/demo.yaml` (see README.md here)."""

import sys

from hf_gate_attention.recipes.summarization.cli import main

sys.exit(main())

"""`python -m recipes.classification --config recipes/classification/configs/text_demo.yaml` (see README.md
here)."""

import sys

from hf_gate_attention.recipes.classification.cli import main

sys.exit(main())

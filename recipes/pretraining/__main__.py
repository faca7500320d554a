"""`python -m recipes.pretraining --config recipes/pretraining/configs/study.yaml` (see README.md here)."""

import sys

from hf_gate_attention.recipes.pretraining.cli import main

sys.exit(main())

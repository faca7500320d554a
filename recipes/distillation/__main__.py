"""`python -m recipes.distillation --config recipes/distillation/configs/distill.yaml`
(see README.md here)."""

import sys

from hf_gate_attention.recipes.distillation.cli import main

sys.exit(main())

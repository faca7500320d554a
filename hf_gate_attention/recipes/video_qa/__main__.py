"""`python -m hf_gate_attention.recipes.video_qa ...` = `hf-gate-attention recipe video_qa ...`."""

import sys

from .cli import main

sys.exit(main())

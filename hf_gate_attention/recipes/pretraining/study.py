"""The pretraining study end to end: corpus, tokenizer, token blocks, every job, then the report.

Layout of `<output_dir>/<name>/`:

    config.json                       the StudyConfig (identity of the folder)
    data.json                         rows and SHA-256 of every split's token blocks (checked on --resume)
    jobs/<run>-lr<rate>-seed<s>/      metrics.json (written last), diagnostics.json (during training),
                                      final_diagnostics.json, model/ and checkpoints/ (not kept in git)
    STUDY.md, study.json, *.png       the report (`report.py`)
"""

from __future__ import annotations

import logging
from pathlib import Path

from transformers import LlamaForCausalLM

from ...files import read_json
from ..common.distributed import check_gates_patch
from ..common.run_dir import check_run_data, claim_run_dir, data_fingerprint, finish_run_dir
from .config import CONFIG_FILE, StudyConfig
from .data import prepare_data
from .report import write_report
from .train import is_finished, llama_config, train_job

logger = logging.getLogger(__name__)


def check_study_dir(config: StudyConfig) -> None:
    """Check that `<output_dir>/<name>/` is new, holds this study (`resume`) or may be replaced
    (`overwrite`); `FileExistsError` otherwise. Read-only."""
    run_dir = config.run_dir
    if config.overwrite:
        return
    saved = read_json(run_dir / CONFIG_FILE)
    if saved is None and run_dir.exists() and any(run_dir.iterdir()):
        raise FileExistsError(f"{run_dir} is not empty and holds no {CONFIG_FILE}; pass --overwrite")
    if saved is not None:
        before, now = StudyConfig.from_dict(saved).identity(), config.identity()
        changed = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))
        if changed:
            raise FileExistsError(
                f"{run_dir} holds a different study (changed: {', '.join(changed)}); pass --overwrite or "
                "choose another --name"
            )
        if not config.resume:
            raise FileExistsError(f"{run_dir} already holds this study; pass --resume to continue it")


def run_study(config: StudyConfig) -> Path:
    """Train every job not finished yet (`config.jobs()` order), then write the report; returns the folder."""
    check_study_dir(config)
    tokenizer, blocks = prepare_data(config)
    model_config = llama_config(config, len(tokenizer), tokenizer.eos_token_id)
    check_gates_patch(config, model_config, LlamaForCausalLM)
    fingerprint = data_fingerprint(blocks)
    check_run_data(config, fingerprint)
    claim_run_dir(config, fingerprint)  # the old study set aside with `overwrite`, deleted once it is done
    jobs = config.jobs()
    for number, job in enumerate(jobs, 1):
        job_dir = config.run_dir / "jobs" / job.name
        if is_finished(job_dir):
            continue
        logger.info("Job %d/%d: %s", number, len(jobs), job.name)
        train_job(config, job, job_dir, blocks, tokenizer, resume=config.resume)
    write_report(config)
    finish_run_dir(config)
    return config.run_dir

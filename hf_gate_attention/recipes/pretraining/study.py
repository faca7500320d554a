"""The pretraining study end to end: corpus, tokenizer, token blocks, every job, then the report.

Layout of `<output_dir>/<name>/`:

    config.json                       the StudyConfig (identity of the folder)
    jobs/<run>-lr<rate>-seed<s>/      metrics.json (written last), diagnostics.json (during training),
                                      final_diagnostics.json, model/ and checkpoints/ (not kept in git)
    STUDY.md, study.json, *.png       the report (`report.py`)
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from ...files import atomic_write_json, read_json
from .config import CONFIG_FILE, StudyConfig
from .data import prepare_data
from .report import write_report
from .train import is_finished, train_job

logger = logging.getLogger(__name__)


def claim_study_dir(config: StudyConfig) -> None:
    """Check that `<output_dir>/<name>/` is new, holds this study (`resume`) or may be replaced
    (`overwrite`), then record the config; `FileExistsError` otherwise."""
    run_dir = config.run_dir
    if config.overwrite and run_dir.exists():
        shutil.rmtree(run_dir)
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
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(run_dir / CONFIG_FILE, config.to_dict())


def run_study(config: StudyConfig) -> Path:
    """Train every job not finished yet (`config.jobs()` order), then write the report; returns the folder."""
    claim_study_dir(config)
    tokenizer, blocks = prepare_data(config)
    jobs = config.jobs()
    for number, job in enumerate(jobs, 1):
        job_dir = config.run_dir / "jobs" / job.name
        if is_finished(job_dir):
            continue
        logger.info("Job %d/%d: %s", number, len(jobs), job.name)
        train_job(config, job, job_dir, blocks, tokenizer, resume=config.resume)
    write_report(config)
    return config.run_dir

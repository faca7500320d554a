"""ROUGE F-measures as an `evaluate` metric, built on `rouge-score`; loads offline from its folder:

    import evaluate
    rouge = evaluate.load("/path/to/hf_gate_attention/recipes/common/summaries/rouge_metric")

(`hf_gate_attention.recipes.summarization.ROUGE_METRIC_PATH` holds that path.) Self-contained on purpose:
`evaluate` copies this file into its module cache, so it must not import the package it ships in.
"""

import datasets
import evaluate
import numpy as np
from rouge_score import rouge_scorer

_CITATION = """\
@inproceedings{lin-2004-rouge,
    title = "{ROUGE}: A Package for Automatic Evaluation of Summaries",
    author = "Lin, Chin-Yew",
    booktitle = "Text Summarization Branches Out",
    year = "2004",
    publisher = "Association for Computational Linguistics",
    url = "https://aclanthology.org/W04-1013",
    pages = "74--81",
}
"""

_DESCRIPTION = """\
ROUGE (rouge1, rouge2, rougeL, rougeLsum) F-measures computed with Google's `rouge-score` package,
averaged over examples (exact mean, no bootstrap). Scores are in [0, 1].

rougeLsum is the summary-level LCS: `rouge-score` splits each prediction and reference into sentences
on newlines ("\\n"), so put one sentence per line beforehand (e.g. `"\\n".join(nltk.sent_tokenize(t))`).
Texts without newlines are a single sentence and get rougeLsum == rougeL.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions: list of generated summaries (strings).
    references: list of reference summaries (strings), one per prediction.
    rouge_types: subset of ["rouge1", "rouge2", "rougeL", "rougeLsum"] (default: all four).
    use_stemmer: Porter-stem words before matching (default True, as in the Transformers
        summarization examples).
    use_aggregator: if True (default) return the mean F-measure per type, else the list of
        per-example F-measures.
Returns:
    dict rouge type -> float (or list of floats with use_aggregator=False).
Examples:
    >>> rouge = evaluate.load(path_of_this_folder)
    >>> rouge.compute(predictions=["the cat sat"], references=["the cat sat"])["rouge1"]
    1.0
"""

ROUGE_TYPES = ["rouge1", "rouge2", "rougeL", "rougeLsum"]


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Rouge(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Value("string"), "references": datasets.Value("string")}
            ),
            codebase_urls=["https://github.com/google-research/google-research/tree/master/rouge"],
            reference_urls=["https://aclanthology.org/W04-1013"],
        )

    def _compute(self, predictions, references, rouge_types=None, use_stemmer=True, use_aggregator=True):
        rouge_types = list(rouge_types or ROUGE_TYPES)
        scorer = rouge_scorer.RougeScorer(rouge_types, use_stemmer=use_stemmer)
        scores = [scorer.score(ref, pred) for ref, pred in zip(references, predictions, strict=True)]
        per_example = {t: [s[t].fmeasure for s in scores] for t in rouge_types}
        if not use_aggregator:
            return per_example
        return {t: float(np.mean(v)) if v else 0.0 for t, v in per_example.items()}

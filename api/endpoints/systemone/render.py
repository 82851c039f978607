"""The /v1/systemone response (the spec's "TypeSafe-compatible API Endpoints" section) from the
probabilities a worker read.

Confidence (0 when every option is equally likely, 1 for certainty):
- choice: (p_max - 1/n) / (1 - 1/n), the excess of the top option over a uniform guess (fits
  the spec's example: 0.9998 of 3 options → 0.9997);
- score: p_max - p_min, the spread of the level distribution (fits the spec's example:
  0.6753 - 0.0023 = 0.673, where the choice formula would give 0.567).
`score` is the expected level index, sum(i * p_i). noul is P(yes).
"""

from __future__ import annotations

from typing import Any

from api.endpoints.systemone.protocol import Question, SystemOneRequest
from scheduler.contract.results import DecisionResult


def choice_confidence(probabilities: list[float]) -> float:
    n = len(probabilities)
    if n < 2:
        return 1.0
    return min(1.0, max(0.0, (max(probabilities) - 1 / n) / (1 - 1 / n)))


def score_confidence(probabilities: list[float]) -> float:
    return min(1.0, max(0.0, max(probabilities) - min(probabilities)))


def answer_json(question: Question, probabilities: list[float]) -> dict[str, Any]:
    criteria = question.criteria
    if question.type == "choice":
        assert isinstance(criteria, dict)
        options = list(criteria)
        best = max(range(len(options)), key=lambda i: probabilities[i])  # first of equals
        return {"type": "choice", "choice": options[best],
                "probabilities": dict(zip(options, probabilities, strict=True)),
                "confidence": choice_confidence(probabilities)}
    if question.type == "score":
        assert isinstance(criteria, list)
        return {"type": "score", "score": sum(i * p for i, p in enumerate(probabilities)),
                "legend": {str(i): text for i, text in enumerate(criteria)},
                "probabilities": {str(i): p for i, p in enumerate(probabilities)},
                "confidence": score_confidence(probabilities)}
    return {"type": "noul", "noul": probabilities[0]}


def systemone_json(body: SystemOneRequest, result: DecisionResult, model: str) -> dict[str, Any]:
    by_id = {answer.id: answer for answer in result.answers}
    return {
        "model": model,
        "answers": {qid: answer_json(question, by_id[qid].probabilities)
                    for qid, question in body.questions.items()},
        "usage": {"input_tokens": sum(a.n_prompt_tokens for a in result.answers),
                  "output_tokens": 0},
    }

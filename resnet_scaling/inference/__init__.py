"""Using a trained run: exact evaluation of its weights, and predictions on images.

| module | job |
|---|---|
| `evaluation.py` | `evaluate_workdir`: one exact pass over an evaluation split with a run's own config |
| `predict.py` | `Predictor`: a run's weights, normalisation and class names, on raw images |
"""

"""Using a trained run: exact evaluation of its weights, and predictions on images.

| module | job |
|---|---|
| `evaluation.py` | `evaluate_workdir`: one exact pass over an evaluation split with a run's own config |
| `predict.py` | `Predictor`: a run's weights, normalisation and class names, on raw images |
"""

from resnet_scaling.job import native_noise as _native_noise

_native_noise.import_jax_quietly()  # Before anything here imports JAX (job/native_noise.py).


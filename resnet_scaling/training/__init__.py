"""Training: from a config's plan to a trained state.

| module | job |
|---|---|
| `sections.py` | `read(config)`: the typed sections the parts take (model, optimizer, data, steps...) |
| `optim.py` | the optimizers (SGD; LARS as TensorFlow 1.12 and MLPerf define it), learning-rate schedules |
| `steps.py` | the train state and the pure `train_step` / `eval_step`, jitted over the mesh |
| `init_from.py` | a run's first state from other weights (torchvision, a workdir, a checkpoint) |
| `training_setup.py` | `setup(config)`: the one path from a config to a compiled step, for every command |
| `trainer.py` | `train_and_evaluate(config, workdir)`: the training loop and what it works with |
"""

from resnet_scaling.job import native_noise as _native_noise

_native_noise.import_jax_quietly()  # Before anything here imports JAX (job/native_noise.py).


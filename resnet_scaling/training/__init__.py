"""Training: from a config's plan to a trained state.

| module | job |
|---|---|
| `plan.py` | every size and duration of a run (`derive`); when the loop logs, evaluates, saves |
| `mesh.py` | the device mesh, batch shardings, host-local batches made global arrays |
| `optim.py` | the optimizers (SGD; LARS as TensorFlow 1.12 and MLPerf define it), learning-rate schedules |
| `steps.py` | the train state and the pure `train_step` / `eval_step`, jitted over the mesh |
| `training_setup.py` | `setup(config)`: the one path from a config to a compiled step, for every command |
| `trainer.py` | `train_and_evaluate(config, workdir)`: the training loop and what it works with |
"""

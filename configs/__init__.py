"""The config files, one per system (and the demo): each `get_config()` starts from the base config.

Shipped inside the package as `resnet_scaling.configs`, so an installed wheel runs them by name
(`--config=pod`) from any directory; in a checkout they are also the files under `configs/`.
"""

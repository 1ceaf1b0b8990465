"""Random state dicts with torchvision's ResNet keys and shapes (`conv1.weight`, `layer1.0.bn1.running_mean`,
`fc.weight`, ...), written from torchvision's architecture, not from `resnet_scaling.models.weights`."""

import numpy as np

from resnet_scaling import models

NUM_CLASSES = 10
NUM_FILTERS = 8


def _conv(rng: np.random.Generator, out_ch: int, in_ch: int, k: int) -> np.ndarray:
    """He-normal (fan-in) OIHW kernel, so activations keep a sensible scale."""
    std = np.sqrt(2.0 / (in_ch * k * k))
    return (rng.standard_normal((out_ch, in_ch, k, k)) * std).astype(np.float32)


def _bn(rng: np.random.Generator, prefix: str, ch: int, sd: dict[str, np.ndarray]) -> None:
    sd[f"{prefix}.weight"] = rng.uniform(0.5, 1.5, ch).astype(np.float32)
    sd[f"{prefix}.bias"] = (0.1 * rng.standard_normal(ch)).astype(np.float32)
    sd[f"{prefix}.running_mean"] = (0.1 * rng.standard_normal(ch)).astype(np.float32)
    sd[f"{prefix}.running_var"] = rng.uniform(0.5, 2.0, ch).astype(np.float32)
    sd[f"{prefix}.num_batches_tracked"] = np.array(1234, dtype=np.int64)


def torchvision_state_dict(name: str, num_classes: int = NUM_CLASSES,
                           num_filters: int = NUM_FILTERS, seed: int = 0) -> dict[str, np.ndarray]:
    """A random state dict with torchvision's keys and shapes for the named architecture."""
    stage_sizes, block_cls = models.ARCHITECTURES[name]
    bottleneck = block_cls is models.BottleneckBlock
    expansion = 4 if bottleneck else 1
    rng = np.random.default_rng(seed)
    sd: dict[str, np.ndarray] = {"conv1.weight": _conv(rng, num_filters, 3, 7)}
    _bn(rng, "bn1", num_filters, sd)
    in_ch = num_filters
    for stage, num_blocks in enumerate(stage_sizes):
        width = num_filters * 2**stage
        for block in range(num_blocks):
            p = f"layer{stage + 1}.{block}"
            stride = 2 if stage > 0 and block == 0 else 1
            if bottleneck:
                convs = [(width, in_ch, 1), (width, width, 3), (width * 4, width, 1)]
            else:
                convs = [(width, in_ch, 3), (width, width, 3)]
            for i, (o, c, k) in enumerate(convs, start=1):
                sd[f"{p}.conv{i}.weight"] = _conv(rng, o, c, k)
                _bn(rng, f"{p}.bn{i}", o, sd)
            if stride != 1 or in_ch != width * expansion:
                sd[f"{p}.downsample.0.weight"] = _conv(rng, width * expansion, in_ch, 1)
                _bn(rng, f"{p}.downsample.1", width * expansion, sd)
            in_ch = width * expansion
    sd["fc.weight"] = (rng.standard_normal((num_classes, in_ch)) / np.sqrt(in_ch)).astype(np.float32)
    sd["fc.bias"] = (0.1 * rng.standard_normal(num_classes)).astype(np.float32)
    return sd

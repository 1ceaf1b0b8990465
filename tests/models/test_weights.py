"""Tests for loading torchvision ResNet weights (`resnet_scaling.models.weights`).

The reference is an independent NumPy forward pass of torchvision's ResNet in eval mode, written
directly against the torchvision state dict (NCHW, OIHW kernels, PyTorch padding).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from resnet_scaling import models
from resnet_scaling.models.weights import from_torchvision, load_torchvision_file
from tests.torchvision_weights import NUM_CLASSES, NUM_FILTERS, torchvision_state_dict

BN_EPS = 1e-5


# --------------------------------------------------------------------------- NumPy reference


def _pad(x: np.ndarray, p: int, value: float = 0.0) -> np.ndarray:
    return np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)), constant_values=value)


def _windows(x: np.ndarray, k: int, stride: int) -> np.ndarray:
    """[N, C, H, W] -> [N, C, H_out, W_out, k, k] (no padding)."""
    win = np.lib.stride_tricks.sliding_window_view(x, (k, k), axis=(2, 3))
    return win[:, :, ::stride, ::stride]


def conv2d(x: np.ndarray, w: np.ndarray, stride: int = 1, padding: int = 0) -> np.ndarray:
    """PyTorch Conv2d without bias: NCHW input, OIHW kernel, symmetric zero padding."""
    win = _windows(_pad(x, padding), w.shape[-1], stride)
    return np.einsum("nchwij,ocij->nohw", win, w, optimize=True)


def max_pool(x: np.ndarray) -> np.ndarray:
    """PyTorch MaxPool2d(kernel_size=3, stride=2, padding=1): implicit -inf padding."""
    return _windows(_pad(x, 1, -np.inf), 3, 2).max(axis=(-2, -1))


def batch_norm(x: np.ndarray, sd: dict[str, np.ndarray], prefix: str) -> np.ndarray:
    """PyTorch BatchNorm2d in eval mode."""
    def get(name):
        return sd[f"{prefix}.{name}"].astype(np.float64)[None, :, None, None]
    inv = get("weight") / np.sqrt(get("running_var") + BN_EPS)
    return (x - get("running_mean")) * inv + get("bias")


def relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0.0)


def reference_forward(sd: dict[str, np.ndarray], x_nchw: np.ndarray) -> np.ndarray:
    """torchvision ResNet (v1.5) eval-mode forward pass, in float64, straight from the state dict."""
    sd64 = {k: v.astype(np.float64) for k, v in sd.items()}
    x = x_nchw.astype(np.float64)
    x = relu(batch_norm(conv2d(x, sd64["conv1.weight"], 2, 3), sd64, "bn1"))
    x = max_pool(x)
    stage = 1
    while f"layer{stage}.0.conv1.weight" in sd64:
        block = 0
        while (p := f"layer{stage}.{block}") + ".conv1.weight" in sd64:
            stride = 2 if stage > 1 and block == 0 else 1
            if f"{p}.conv3.weight" in sd64:  # Bottleneck: stride on the 3x3 (v1.5).
                y = relu(batch_norm(conv2d(x, sd64[f"{p}.conv1.weight"]), sd64, f"{p}.bn1"))
                y = relu(batch_norm(conv2d(y, sd64[f"{p}.conv2.weight"], stride, 1), sd64,
                                    f"{p}.bn2"))
                y = batch_norm(conv2d(y, sd64[f"{p}.conv3.weight"]), sd64, f"{p}.bn3")
            else:  # BasicBlock.
                y = relu(batch_norm(conv2d(x, sd64[f"{p}.conv1.weight"], stride, 1), sd64,
                                    f"{p}.bn1"))
                y = batch_norm(conv2d(y, sd64[f"{p}.conv2.weight"], 1, 1), sd64, f"{p}.bn2")
            if f"{p}.downsample.0.weight" in sd64:
                x = batch_norm(conv2d(x, sd64[f"{p}.downsample.0.weight"], stride, 0), sd64,
                               f"{p}.downsample.1")
            x = relu(x + y)
            block += 1
        stage += 1
    x = x.mean(axis=(2, 3))
    return x @ sd64["fc.weight"].T + sd64["fc.bias"]


# --------------------------------------------------------------------------- tests


def _model(name: str, num_classes: int = NUM_CLASSES) -> models.ResNet:
    return models.create_model(name, num_classes=num_classes, num_filters=NUM_FILTERS)


def _inputs(seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((2, 3, 64, 64)).astype(np.float32)


@pytest.mark.parametrize("name", ["resnet18", "resnet50"])
def test_matches_numpy_reference(name):
    sd = torchvision_state_dict(name)
    model = _model(name)
    variables = from_torchvision(sd, model)
    x_nchw = _inputs()
    ours = np.asarray(model.apply(variables, x_nchw.transpose(0, 2, 3, 1), train=False))
    ref = reference_forward(sd, x_nchw)
    assert ours.shape == ref.shape == (2, NUM_CLASSES)
    assert ours.dtype == np.float32
    assert np.abs(ref).max() > 1e-2  # The comparison is not trivially of zeros.
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_variables_match_init_structure_and_are_float32():
    model = _model("resnet50")
    variables = from_torchvision(torchvision_state_dict("resnet50"), model)
    expected = jax.eval_shape(
        lambda: model.init(jax.random.PRNGKey(0), np.zeros((1, 32, 32, 3), np.float32),
                           train=False))
    assert set(variables) == {"params", "batch_stats"}
    got_leaves = jax.tree_util.tree_leaves_with_path(variables)
    want_leaves = jax.tree_util.tree_leaves_with_path(expected)
    assert [p for p, _ in got_leaves] == [p for p, _ in want_leaves]
    for (_, got), (_, want) in zip(got_leaves, want_leaves, strict=True):
        assert isinstance(got, np.ndarray)
        assert got.dtype == np.float32
        assert got.shape == want.shape
    # Layouts: OIHW -> HWIO, [out, in] -> [in, out].
    assert variables["params"]["stem_conv"]["kernel"].shape == (7, 7, 3, NUM_FILTERS)
    assert variables["params"]["classifier"]["kernel"].shape == (8 * NUM_FILTERS * 4, NUM_CLASSES)


def test_num_batches_tracked_is_ignored():
    sd = torchvision_state_dict("resnet18")
    assert any(k.endswith("num_batches_tracked") for k in sd)
    without = {k: v for k, v in sd.items() if not k.endswith("num_batches_tracked")}
    model = _model("resnet18")
    a, b = from_torchvision(sd, model), from_torchvision(without, model)
    jax.tree.map(np.testing.assert_array_equal, a, b)


def test_accepts_tensor_like_values():
    class FakeTensor:
        """Quacks like a torch tensor: .detach().cpu().numpy()."""

        def __init__(self, array):
            self._array = array

        def detach(self):
            return self

        def cpu(self):
            return self

        def numpy(self):
            return self._array

    sd = torchvision_state_dict("resnet18")
    model = _model("resnet18")
    got = from_torchvision({k: FakeTensor(v) for k, v in sd.items()}, model)
    jax.tree.map(np.testing.assert_array_equal, got, from_torchvision(sd, model))


def test_wrong_num_classes_says_so():
    sd = torchvision_state_dict("resnet18", num_classes=1000)
    with pytest.raises(ValueError) as info:
        from_torchvision(sd, _model("resnet18", num_classes=NUM_CLASSES))
    message = str(info.value)
    assert "'fc.weight'" in message and "'fc.bias'" in message
    assert f"({NUM_CLASSES}, {8 * NUM_FILTERS})" in message
    assert f"(1000, {8 * NUM_FILTERS})" in message
    assert "num_classes=1000" in message


def test_wrong_conv_shape_names_key_and_shapes():
    sd = torchvision_state_dict("resnet18")
    sd["layer2.0.conv1.weight"] = np.zeros((16, 8, 5, 5), np.float32)
    with pytest.raises(ValueError, match=r"'layer2\.0\.conv1\.weight'.*\(16, 8, 3, 3\).*"
                                         r"\(16, 8, 5, 5\)"):
        from_torchvision(sd, _model("resnet18"))


def test_missing_key():
    sd = torchvision_state_dict("resnet50")
    del sd["layer2.0.downsample.1.running_var"]
    with pytest.raises(ValueError, match=r"missing key 'layer2\.0\.downsample\.1\.running_var'"):
        from_torchvision(sd, _model("resnet50"))


def test_unexpected_key():
    sd = torchvision_state_dict("resnet18")
    sd["layer5.0.conv1.weight"] = np.zeros((3, 3, 3, 3), np.float32)
    with pytest.raises(ValueError, match=r"unexpected key 'layer5\.0\.conv1\.weight'"):
        from_torchvision(sd, _model("resnet18"))


def test_wrong_architecture_is_rejected():
    with pytest.raises(ValueError, match="does not match the model"):
        from_torchvision(torchvision_state_dict("resnet50"), _model("resnet18"))


def test_load_torchvision_file(tmp_path):
    sd = torchvision_state_dict("resnet18")
    path = tmp_path / "resnet18.npz"
    np.savez(path, **sd)
    model = _model("resnet18")
    got = load_torchvision_file(path, model)
    jax.tree.map(np.testing.assert_array_equal, got, from_torchvision(sd, model))

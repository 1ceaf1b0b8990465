"""`resnet_tiny`'s sizes and FLOPs counted by hand from its architecture, not from the model code: the oracle
the compile reports' and the run summaries' figures are held to."""

import numpy as np


def resnet_tiny_sizes(num_filters: int = 8, num_classes: int = 10) -> tuple[int, int, int]:
    """(parameters, BN statistics, channels of the projection BNs) of `resnet_tiny`, counted from its
    architecture (stem conv 7x7 + BN; four stages of one basic block of two 3x3 convs + BNs, a 1x1
    projection + BN where the width doubles; dense), not from the model code."""
    conv_weights, bn_channels, projection_channels = 7 * 7 * 3 * num_filters, num_filters, 0
    width = num_filters
    for stage in range(4):
        out = num_filters * 2**stage
        conv_weights += 9 * width * out + 9 * out * out
        bn_channels += 2 * out
        if out != width:
            conv_weights += width * out
            bn_channels += out
            projection_channels += out
        width = out
    num_params = conv_weights + 2 * bn_channels + width * num_classes + num_classes
    return num_params, 2 * bn_channels, projection_channels


def _valid_taps(size: int, kernel: int, stride: int, padding: int) -> tuple[int, int]:
    """(output size, kernel taps that land inside the input, summed over the output positions) of one
    spatial axis of a convolution: a tap on the zero padding is no multiply-add, and XLA counts none."""
    out = (size + 2 * padding - kernel) // stride + 1
    rows = np.arange(out)[:, None] * stride - padding + np.arange(kernel)[None, :]
    return out, int(((rows >= 0) & (rows < size)).sum())


def resnet_tiny_train_flops_per_image(num_filters: int = 8, num_classes: int = 10, image_size: int = 32,
                                      *, count_padding: bool = False) -> int:
    """FLOPs of the convolutions and the classifier in one training step, per image, counted from
    `resnet_tiny`'s architecture (stem 7x7/2 pad 3, 3x3/2 max pool, four basic blocks of 3x3 pad 1 convs,
    the first of a stage strided, 1x1/2 projections where the width doubles; dense), not from the model.

    Each layer's forward multiply-adds (both axes' in-image taps x channels in x out) recur twice in the
    backward pass, for the weight and for the input gradient, except the stem's input gradient: nothing
    needs the gradient of the images. A multiply-add is 2 FLOPs.

    With `count_padding`, the taps on the zero padding count too: an upper bound for the CPU forms of the
    convolutions (`model.lowering`), whose products over the input's patches multiply the padding's zeros.
    """
    def conv(size, channels_in, channels_out, kernel, stride, padding):
        out, taps = _valid_taps(size, kernel, stride, padding)
        if count_padding:
            taps = out * kernel
        return out, taps * taps * channels_in * channels_out

    size, stem = conv(image_size, 3, num_filters, 7, 2, 3)
    size = (size + 2 - 3) // 2 + 1  # 3x3 max pool, stride 2, padding 1
    macs, width = stem, num_filters
    for stage in range(4):
        out, stride = num_filters * 2**stage, 1 if stage == 0 else 2
        block_size, first = conv(size, width, out, 3, stride, 1)
        _, second = conv(block_size, out, out, 3, 1, 1)
        macs += first + second + (conv(size, width, out, 1, stride, 0)[1] if out != width else 0)
        size, width = block_size, out
    macs += width * num_classes
    return 2 * (3 * macs - stem)

"""A stand-in for Triton's image classifiers: one image tensor in, scores of 4 colour classes out.

It has no ``metadata`` hook: the folder's ``config.pbtxt`` gives its input and
output (``inception_graphdef``: NHWC ``[299, 299, 3]`` with a batch dimension;
``densenet_onnx``: NCHW ``[3, 224, 224]`` without one) and names the label file.
Each image's scores are computed from its colours, so a test knows the top class:
the share of each of red, green and blue in the channels' mean (after shifting
the image's smallest value to 0), and ``gray``, 1 minus how far the channel means
spread apart relative to the largest one.  A scaling that shifts and stretches
every channel alike (Triton's ``INCEPTION``, or none) gives the same scores.
"""

import numpy as np
import servekit


@servekit.hookimpl
def load(path):
    return "colour classifier"


@servekit.hookimpl
def predict(inputs):
    (images,) = inputs.values()
    x = np.asarray(images, dtype=np.float32)
    batched = x.ndim == 4
    if not batched:
        x = x[np.newaxis]
    if x.shape[-1] != 3:  # NCHW
        x = np.moveaxis(x, 1, -1)
    scores = np.stack([colour_scores(image) for image in x]).astype(np.float32)
    return scores if batched else scores[0]


def colour_scores(image):
    """red, green, blue, gray for one HWC image."""
    means = (image - image.min()).reshape(-1, 3).mean(axis=0)
    total, top = float(means.sum()), float(means.max())
    shares = means / total if total > 0 else np.full(3, 1 / 3)
    spread = (top - float(means.min())) / top if top > 0 else 0.0
    return np.append(shares, 1.0 - spread)

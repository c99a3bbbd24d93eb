"""Decodes encoded images (JPEG, PNG, ...: one BYTES element per row) into the classifier's input.

Each image becomes RGB, is resized to 299 x 299 (bilinear) and scaled as
Triton's ``INCEPTION`` scaling does (``x / 127.5 - 1``): ``[batch, 299, 299, 3]``
FP32.  An element that is not an image is a 400 naming the row.
"""

import io

import numpy as np
import servekit
from PIL import Image, UnidentifiedImageError
from servekit.errors import BadRequest

SIZE = (299, 299)


@servekit.hookimpl
def load(path):
    return "image preprocessing"


@servekit.hookimpl
def predict(inputs):
    rows = np.asarray(inputs["INPUT"], dtype=object).reshape(-1)
    return np.stack([decoded(row, data) for row, data in enumerate(rows)])


def decoded(row, data):
    try:
        image = Image.open(io.BytesIO(bytes(data))).convert("RGB")
    except (UnidentifiedImageError, OSError) as exc:
        raise BadRequest(f"INPUT row {row} is not an image: {exc}") from None
    pixels = np.asarray(image.resize(SIZE, Image.BILINEAR), dtype=np.float32)
    return pixels / 127.5 - 1

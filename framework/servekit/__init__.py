"""servekit: plugin-based serving for custom model containers.

Write hooks with :data:`hookimpl`; see ``docs/hooks.md``.
"""

from __future__ import annotations

from .errors import BadRequest, NotFound, ServekitError
from .hookspecs import hookimpl
from .types import ModelConfig, ModelMetadata, Signature, TensorSpec

__version__ = "0.1.0"

__all__ = [
    "BadRequest",
    "ModelConfig",
    "ModelMetadata",
    "NotFound",
    "ServekitError",
    "Signature",
    "TensorSpec",
    "__version__",
    "hookimpl",
]

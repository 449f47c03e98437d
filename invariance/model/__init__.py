"""``invariance model``: find the first op that breaks batch invariance in a whole model.

:func:`check_model` runs one request through a model alone and inside batches (batch sizes,
order, padding, a KV-cache decode, decode vs prefill), records every module's output for that
request, and reports the origin (the first module whose inputs agree bit for bit and whose output
does not, and the first torch op inside it that differs), how the difference grows to the
output, and a shrunk reproducer (:func:`replay_model`). Layers: ``loading`` (models without
downloads), ``inputs`` (calling a model, requests, plans), ``scenarios``, ``record`` (hooks,
cutting tensors to one request, forcing, op traces), ``attention`` (a transformers model's
attention through an invariance backend), ``check`` (the driver), ``report`` (the versioned JSON
form).
"""

from __future__ import annotations

from invariance.model.check import CASE_SCHEMA, DEFAULT_BATCH_SIZES, check_model, replay_model
from invariance.model.inputs import ModelInterface, detect_interface
from invariance.model.loading import CONFIGS, load_model
from invariance.model.report import (
    MODEL_SCHEMA,
    LayerPoint,
    ModelReport,
    OpFinding,
    Origin,
    OriginGroup,
    Reproducer,
    ScenarioResult,
    TokenFlip,
)
from invariance.model.scenarios import FAMILIES

__all__ = [
    "CASE_SCHEMA",
    "CONFIGS",
    "DEFAULT_BATCH_SIZES",
    "FAMILIES",
    "MODEL_SCHEMA",
    "LayerPoint",
    "ModelInterface",
    "ModelReport",
    "OpFinding",
    "Origin",
    "OriginGroup",
    "Reproducer",
    "ScenarioResult",
    "TokenFlip",
    "check_model",
    "detect_interface",
    "load_model",
    "replay_model",
]

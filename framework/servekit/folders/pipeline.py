"""Pipelines: a model made of other served models, tensors wired between its steps (Triton's ensembles).

A model folder whose ``servekit.yaml`` holds ``pipeline:`` has no artifact of
its own; one request in runs each step on the model it names, in order, and
the pipeline's outputs come back as one answer::

    pipeline:
      inputs: [{name: IN, datatype: INT32, shape: [-1, 16]}]
      outputs: [{name: OUT, datatype: INT32, shape: [-1, 16]}]
      steps:
        - model: simple             # version: N (optional; the latest by default)
          inputs: {INPUT0: IN, INPUT1: IN}       # the step's input <- a pipeline tensor
          outputs: {OUTPUT0: doubled}            # the step's output -> a pipeline tensor
        - model: simple
          inputs: {INPUT0: doubled, INPUT1: IN}
          outputs: {OUTPUT0: OUT}

``inputs`` and ``outputs`` may list bare names; a tensor's datatype and shape
then come from the step that takes or makes it (its model's metadata).  Each
step is an ordinary request to its model, so it is checked, batched (with the
model's other requests) and counted in its statistics as any other.  The
request's parameters reach every step.

Triton's ensemble configuration (``config.pbtxt`` with ``platform:
"ensemble"`` and ``ensemble_scheduling``, in the folder beside an empty
version folder) maps onto the same: ``input_map``/``output_map`` are a step's
``inputs``/``outputs``, ``model_version: -1`` the latest
(:func:`from_triton_config`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from servekit.errors import BadRequest
from servekit.folders import triton_config as triton_model_config
from servekit.types import ModelMetadata, Signature, TensorSpec

TRITON_CONFIG = "config.pbtxt"


class PipelineError(ValueError):
    """A pipeline that cannot run as written (reported as the version's load error)."""


@dataclass
class Step:
    model: str
    version: int | None = None
    #: the step model's input name -> the pipeline tensor it takes
    inputs: dict[str, str] = field(default_factory=dict)
    #: the step model's output name -> the pipeline tensor it makes
    outputs: dict[str, str] = field(default_factory=dict)


#: ``labels_of(step, output)``: the class labels of a step model's output (``None``: it has none).
LabelsOf = Callable[[Step, str], "list[str] | None"]


@dataclass
class Pipeline:
    steps: list[Step]
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    #: where a step's labels come from (set by the repository that serves the steps)
    labels_of: LabelsOf | None = field(default=None, repr=False, compare=False)

    def producer(self, tensor: str) -> tuple[Step, str] | None:
        """The step that makes the pipeline tensor ``tensor`` last, and its own name for it."""
        for step in reversed(self.steps):
            for name, target in step.outputs.items():
                if target == tensor:
                    return step, name
        return None

    def output_labels(self, tensor: str) -> list[str] | None:
        """The labels of the step output that makes ``tensor``, as Triton labels an ensemble's output."""
        made = self.producer(tensor)
        if made is None or self.labels_of is None:
            return None
        return self.labels_of(*made)

    def metadata(self) -> ModelMetadata:
        return ModelMetadata(
            signatures={"serving_default": Signature(inputs=list(self.inputs), outputs=list(self.outputs))},
            platform="pipeline",
        )


def parse(raw: Any) -> Pipeline:
    """``pipeline:`` of servekit.yaml, checked: every step's tensors come from somewhere."""
    if not isinstance(raw, dict) or set(raw) - {"inputs", "outputs", "steps"}:
        raise PipelineError("'pipeline' takes inputs, outputs and steps")
    steps_raw = raw.get("steps")
    if not isinstance(steps_raw, list) or not steps_raw:
        raise PipelineError("'pipeline.steps' must list at least one step")
    steps = [_step(i, s) for i, s in enumerate(steps_raw, 1)]
    inputs = [_spec(s, "pipeline.inputs") for s in _listed(raw.get("inputs"), "pipeline.inputs")]
    outputs = [_spec(s, "pipeline.outputs") for s in _listed(raw.get("outputs"), "pipeline.outputs")]
    known = {spec.name for spec in inputs}
    for i, step in enumerate(steps, 1):
        missing = sorted(set(step.inputs.values()) - known)
        if missing:
            raise PipelineError(
                f"pipeline step {i} ({step.model}) takes {', '.join(missing)}, which neither the pipeline's "
                "inputs nor an earlier step provide"
            )
        known |= set(step.outputs.values())
    unmade = sorted({spec.name for spec in outputs} - known)
    if unmade:
        raise PipelineError(f"pipeline output(s) {', '.join(unmade)} are made by no step")
    if not outputs:
        raise PipelineError("'pipeline.outputs' must name at least one tensor")
    return Pipeline(steps, inputs, outputs)


def _listed(raw: Any, where: str) -> list[Any]:
    if raw is None:
        raise PipelineError(f"'{where}' must list the pipeline's tensors")
    if not isinstance(raw, list):
        raise PipelineError(f"'{where}' must be a list of names or {{name, datatype, shape}}")
    return raw


def _spec(raw: Any, where: str) -> TensorSpec:
    if isinstance(raw, str):
        return TensorSpec(raw, "", None)
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) or set(raw) - {"name", "datatype", "shape"}:
        raise PipelineError(f"'{where}' entries are names or {{name, datatype, shape}}, found {raw!r}")
    shape = raw.get("shape")
    if shape is not None and (not isinstance(shape, list) or not all(type(d) is int for d in shape)):
        raise PipelineError(f"'{where}': the shape of {raw['name']!r} must be a list of integers (-1: any size)")
    return TensorSpec(raw["name"], str(raw.get("datatype", "")), shape)


def _step(i: int, raw: Any) -> Step:
    where = f"pipeline step {i}"
    if not isinstance(raw, dict) or set(raw) - {"model", "version", "inputs", "outputs"}:
        raise PipelineError(f"{where} takes model, version, inputs and outputs")
    model = raw.get("model")
    if not isinstance(model, str) or not model:
        raise PipelineError(f"{where} needs the 'model' it runs")
    version = raw.get("version")
    if version is not None and (isinstance(version, bool) or not isinstance(version, int) or version < 1):
        raise PipelineError(f"{where}: 'version' must be a version number")
    wiring = {}
    for key in ("inputs", "outputs"):
        mapping = raw.get(key)
        if (
            not isinstance(mapping, dict)
            or not mapping
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in mapping.items())
        ):
            raise PipelineError(f"{where}: '{key}' must map the model's tensor names to pipeline tensor names")
        wiring[key] = dict(mapping)
    return Step(model, version, wiring["inputs"], wiring["outputs"])


# -- running ---------------------------------------------------------------------------------


def run(pipeline: Pipeline, inputs: Any, call: Any) -> dict[str, Any]:
    """Run the steps; ``call(step, tensors)`` runs one step's request and returns its named outputs."""
    if not isinstance(inputs, dict):
        raise BadRequest("a pipeline takes named input tensors")
    declared = {spec.name for spec in pipeline.inputs}
    missing = sorted(declared - set(inputs))
    if missing:
        raise BadRequest(f"the pipeline needs input(s) {', '.join(missing)}")
    unknown = sorted(set(inputs) - declared)
    if unknown:
        raise BadRequest(f"the pipeline takes no input(s) {', '.join(unknown)}; it takes {', '.join(sorted(declared))}")
    tensors = dict(inputs)
    for step in pipeline.steps:
        answer = call(step, {name: tensors[source] for name, source in step.inputs.items()})
        for name, target in step.outputs.items():
            if name not in answer:
                raise BadRequest(
                    f"pipeline step {step.model}: the model answered {', '.join(answer) or 'nothing'}, not {name!r}"
                )
            tensors[target] = answer[name]
    return {spec.name: tensors[spec.name] for spec in pipeline.outputs}


def described(pipeline: Pipeline, metadata_of: Any, labels_of: LabelsOf | None = None) -> Pipeline:
    """Fill a tensor's missing datatype and shape from the step models' metadata (``metadata_of(step)``,
    ``None`` when that model is not loaded yet); ``labels_of`` gives the steps' labels, asked when a
    request wants an output's classes."""
    takes: dict[str, TensorSpec] = {}
    makes: dict[str, TensorSpec] = {}
    for step in pipeline.steps:
        meta = metadata_of(step)
        signature = meta.signature() if meta is not None else None
        if signature is None:
            continue
        specs_in = {s.name: s for s in signature.inputs}
        specs_out = {s.name: s for s in signature.outputs}
        for name, source in step.inputs.items():
            if name in specs_in:
                takes.setdefault(source, specs_in[name])
        for name, target in step.outputs.items():
            if name in specs_out:
                makes[target] = specs_out[name]

    def fill(spec: TensorSpec, found: dict[str, TensorSpec]) -> TensorSpec:
        other = found.get(spec.name)
        if spec.datatype or other is None:
            return spec
        return TensorSpec(spec.name, other.datatype, spec.shape if spec.shape is not None else other.shape)

    return Pipeline(
        pipeline.steps,
        [fill(s, takes) for s in pipeline.inputs],
        [fill(s, makes) for s in pipeline.outputs],
        labels_of,
    )


# -- Triton's ensembles -----------------------------------------------------------------------


def from_triton_config(doc: dict[str, Any] | None) -> dict[str, Any] | None:
    """The ``pipeline:`` a Triton ensemble configuration stands for (``None``: not one).

    ``doc`` is the folder's ``config.pbtxt`` as :func:`servekit.folders.triton_config.read` gives it.
    """
    if not doc or doc.get("platform") != "ensemble":
        return None
    scheduling = doc.get("ensemble_scheduling")
    if not isinstance(scheduling, dict):
        raise PipelineError(f"{TRITON_CONFIG}: an ensemble needs ensemble_scheduling")
    steps = []
    for step in scheduling.get("step", []):
        version = int(step.get("model_version", -1))
        steps.append(
            {
                "model": step.get("model_name"),
                **({"version": version} if version > 0 else {}),
                "inputs": _names(step.get("input_map")),
                "outputs": _names(step.get("output_map")),
            }
        )
    meta = triton_model_config.metadata(doc)
    signature = meta.signature() if meta is not None else None
    return {
        "inputs": [_tensor(t) for t in (signature.inputs if signature else [])],
        "outputs": [_tensor(t) for t in (signature.outputs if signature else [])],
        "steps": steps,
    }


def _names(mapping: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in mapping.items()} if isinstance(mapping, dict) else {}


def _tensor(spec: TensorSpec) -> dict[str, Any]:
    return {"name": spec.name, "datatype": spec.datatype, "shape": spec.shape}

"""{{ cookiecutter.project_name }}: a ONNX model served by servekit's onnx plugin.

There is no ``load`` hook here: the plugin loads ``1/model.onnx`` (and ``2/model.onnx``...
as new versions appear), describes the model's inputs and outputs from the file
itself and answers ``predict``, the graph's outputs, on the CPU or, with ``device: cuda``, the GPU, on every protocol.

Hooks written in this file run before the plugin's, for this model only (see
servekit's docs/hooks.md), e.g. to map the plugin's answer::

    @servekit.hookimpl
    def postprocess(outputs):
        return {"label": ..., **outputs}

Leave the file as it is to serve the model exactly as ONNX answers.
"""

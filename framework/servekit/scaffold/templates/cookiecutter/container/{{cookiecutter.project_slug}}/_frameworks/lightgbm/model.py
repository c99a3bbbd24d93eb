"""{{ cookiecutter.project_name }}: a LightGBM model served by servekit's lightgbm plugin.

There is no ``load`` hook here: the plugin loads ``1/model.txt`` (and ``2/model.txt``...
as new versions appear), describes the model's inputs and outputs from the file
itself and answers ``predict``, ``predict_proba``, ``predict_raw``, ``:classify`` and ``:explain`` (TreeSHAP), on every protocol.

Hooks written in this file run before the plugin's, for this model only (see
servekit's docs/hooks.md), e.g. to map the plugin's answer::

    @servekit.hookimpl
    def postprocess(outputs):
        return {"label": ..., **outputs}

Leave the file as it is to serve the model exactly as LightGBM answers.
"""

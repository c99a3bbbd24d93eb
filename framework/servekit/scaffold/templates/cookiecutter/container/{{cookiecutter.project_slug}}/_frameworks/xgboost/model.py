"""{{ cookiecutter.project_name }}: a XGBoost model served by servekit's xgboost plugin.

There is no ``load`` hook here: the plugin loads ``1/model.json`` (and ``2/model.json``...
as new versions appear), describes the model's inputs and outputs from the file
itself and answers ``predict``, ``predict_proba``, ``predict_margin``, ``:classify`` and ``:explain`` (TreeSHAP), on every protocol.

Hooks written in this file run before the plugin's, for this model only (see
servekit's docs/hooks.md), e.g. to map the plugin's answer::

    @servekit.hookimpl
    def postprocess(outputs):
        return {"label": ..., **outputs}

Leave the file as it is to serve the model exactly as XGBoost answers.
"""

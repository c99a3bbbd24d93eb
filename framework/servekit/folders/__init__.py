"""What a model folder declares: its layout, ``servekit.yaml``, pipelines, Triton's ``config.pbtxt``, TF Serving's model config, and the artifact a plugin serves."""

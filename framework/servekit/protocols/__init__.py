"""Thin wire-protocol translators over the data plane, one module per protocol."""

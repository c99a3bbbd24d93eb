"""Wire formats to and from numpy: JSON (TF Serving's mapping), V2 JSON and binary, protos."""

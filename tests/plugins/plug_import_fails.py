"""A module whose import raises (not ImportError): the preflight tests' import path that fails on import."""

raise RuntimeError("this module refuses to import")

"""The schema is data: named fields with dtype, shape, codec and nullability, stored as JSON.

``model``: ``Field`` and ``Schema``; ``values``: what a field's values may be and their exact
conversion (``Field.converter``, ``cast_exactly``); ``inference``: the schema that records
imply (``infer_schema``). Every name is importable from ``yogadl_plus.schema`` itself.
"""

from __future__ import annotations

from yogadl_plus.schema.inference import infer_field, infer_schema, infer_value
from yogadl_plus.schema.model import MAX_NAME_BYTES, Field, Schema
from yogadl_plus.schema.values import cast_exactly

__all__ = [
    "MAX_NAME_BYTES",
    "Field",
    "Schema",
    "cast_exactly",
    "infer_field",
    "infer_schema",
    "infer_value",
]

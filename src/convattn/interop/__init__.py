"""Conversions between convattn models and other libraries' implementations.

* `convattn.interop.convbert`: `transformers`' ConvBERT (`from_transformers`, `to_transformers`).
"""

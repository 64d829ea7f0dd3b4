"""Data: pretraining corpora, tokenizers, sequence formatting (and GLUE loaders)."""

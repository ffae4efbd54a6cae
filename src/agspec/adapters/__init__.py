"""Adapters: the only code that knows an inference engine.

Each adapter is an optional extra and imports its engine lazily:

- `agspec.adapters.llama_cpp`: llama-cpp-python (`draft_model=` hook and an own loop);
- `agspec.adapters.transformers`: HF transformers assisted generation at batch 1.
"""

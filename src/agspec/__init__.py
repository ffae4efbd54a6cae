"""AgSpec: a retrieval-based speculative-decoding drafter for coding-agent pipelines.

Submodules are imported on use; `import agspec` stays cheap and never needs an engine.
"""

__version__ = "0.1.0"

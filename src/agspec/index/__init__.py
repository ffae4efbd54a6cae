"""Retrieval engines other than the native index, behind the `TokenIndex` interface.

The corpora and the drafter take an index factory (`AgSpecConfig.engine`, see
`agspec.drafter.ENGINES` and docs/design.md, "Retrieval engines"); an engine here is an
index class with `extend / extend_list / match` whose cursors have `extend / extend_list /
match_length / continuation` and optionally `engine_max_tokens`.

- `agspec.index.suffix_tree`: SuffixDecoding's suffix tree (arctic-inference 0.3.0, the
  `suffix` extra), imported lazily so the package works without it.
"""

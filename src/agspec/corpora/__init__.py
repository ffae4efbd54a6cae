"""The corpora by source: session, workspace, global (paper §3.1), and a call's corpus set.

Each corpus is its own index (`agspec.index`). Live corpora (session, workspace) belong to
one session and are dropped with it; the global corpus is built offline and loaded
read-only. `corpus_set.CorpusSet` holds every corpus one call drafts from.
"""

from agspec.corpora.global_ import GlobalCorpus
from agspec.corpora.session import SessionCorpus, split_messages
from agspec.corpora.workspace import WorkspaceCorpus

__all__ = ["GlobalCorpus", "SessionCorpus", "WorkspaceCorpus", "split_messages"]

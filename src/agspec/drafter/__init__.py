"""The AgSpec drafter: server → session → per-call drafter (paper §3).

    server = AgSpecServer(tokenizer=get_tokenizer("qwen2.5"), global_corpus=g)
    session = server.session("task-42", emission_format="unified_diff")
    session.open_artifact("src/app.py", text)
    call = session.call(agent="coder", role="code", turn=1)
    call.begin(prompt_ids)
    draft = call.propose(32)        # ... the engine verifies ...
    call.accept(committed_ids)      # accepted draft prefix + the bonus token
    call.end()
    session.end()

Per step: the same context is matched in the session, workspace and global corpora
(longest match lengths m_s, m_w, m_g); the draft comes from global only when
m_g > max(m_s, m_w) + δ, else from workspace when m_w > m_s, else from session.
Session and global copy the most frequent next-3-token group (ties: most recent);
workspace copies its first occurrence. Length: L = min(max(1, ⌊α_a·m⌋), C_a), no more
than the tokens available.
"""

from agspec.drafter.batch import step_batch
from agspec.drafter.call import AgSpecCall
from agspec.drafter.config import AgSpecConfig, LengthMode
from agspec.drafter.server import AgSpecServer
from agspec.drafter.session import AgSpecSession
from agspec.drafter.variants import VARIANTS
from agspec.index.engines import ENGINES
from agspec.policy.source import Source, choose_source

__all__ = [
    "ENGINES",
    "VARIANTS",
    "AgSpecCall",
    "AgSpecConfig",
    "AgSpecServer",
    "AgSpecSession",
    "LengthMode",
    "Source",
    "choose_source",
    "step_batch",
]

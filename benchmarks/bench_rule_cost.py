"""Why the continuation rules live in C++: the "frequent" rule native vs in Python.

The Python version gets its occurrences from the native cursor in one call and reads the
documents from Python lists it holds already (free access, which a real Python rule would
not have), so its cost is a lower bound. Both give the same drafts (checked).

    python benchmarks/bench_rule_cost.py
"""

import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from devtraces import dev_sessions

from agspec.index.token_index import TokenIndex
from agspec.tokenizers import get_tokenizer
from agspec.traces import render_call

tok = get_tokenizer("qwen2.5")
sessions = dev_sessions("swe-agent")
ix = TokenIndex()
docs = {}
n = 0
for s in sessions:
    for c in s.calls:
        p, o = render_call(c, tok)
        d = p + o
        docs[len(docs)] = d
        ix.extend(len(docs) - 1, d)
        n += len(d)
    if n > 1_000_000:
        break
rng = random.Random(0)
queries = []
keys = list(docs)
while len(queries) < 3000:
    d = docs[rng.choice(keys)]
    if len(d) < 40:
        continue
    i = rng.randrange(8, len(d) - 20)
    queries.append(d[i - 8 : i])
curs = []
for q in queries:
    c = ix.match(q, max_match_tokens=64)
    if c.match_length >= 2:
        curs.append(c)


def py_frequent(c, n=16, k=32):
    occ = c.occurrences(k)
    groups = {}
    order = []
    for j, (doc, off) in enumerate(occ):
        key = tuple(docs[doc][off + 1 : off + 4])
        if key in groups:
            groups[key][0] += 1
        else:
            groups[key] = [1, j]
            order.append(key)
    best = order[0]
    for key in order[1:]:
        if groups[key][0] > groups[best][0]:
            best = key
    doc, off = occ[groups[best][1]]
    return docs[doc][off + 1 : off + 1 + n]


for name, f in (
    ("native", lambda c: c.continuation(16, "frequent", max_occurrences=32)),
    ("python (free document access)", py_frequent),
):
    ts = []
    for _rep in range(3):
        t = time.perf_counter()
        for c in curs:
            f(c)
        ts.append((time.perf_counter() - t) / len(curs) * 1e6)
    print(f"{name}: {min(ts):.2f} us per continuation over {len(curs)} matches ({n:,}-token index)")
assert all(c.continuation(16, "frequent", max_occurrences=32) == py_frequent(c) for c in curs[:500])
print("same drafts on 500 matches")

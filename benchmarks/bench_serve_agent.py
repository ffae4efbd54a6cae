"""mini-swe-agent (unmodified, its own virtualenv) on the bundled tasks against local servers:
by default `agspec serve`, `agspec serve --drafter none`, llama.cpp's `llama-server` and
the same with `--spec-type ngram-mod`; `--servers` also takes llama-cpp-python's server,
plain and with its prompt-lookup draft model (agspec.pipeline.agent_bench has the details).

    flock /tmp/agspec-bench.lock python benchmarks/bench_serve_agent.py \
        --tasks paginate,leap-years,word-count --step-limit 6 --out /tmp/serve-agent.json
"""

import sys

from agspec.pipeline.agent_bench import main

if __name__ == "__main__":
    sys.exit(main())

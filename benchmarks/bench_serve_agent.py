"""mini-swe-agent (unmodified, its own virtualenv) on the bundled tasks against four local
servers: `agspec serve`, `agspec serve --drafter none`, llama-cpp-python's server and the
same with its prompt-lookup draft model (agspec.pipeline.agent_bench has the details).

    flock /tmp/agspec-bench.lock python benchmarks/bench_serve_agent.py \
        --tasks paginate,leap-years,word-count --step-limit 6 --out /tmp/serve-agent.json
"""

import sys

from agspec.pipeline.agent_bench import main

if __name__ == "__main__":
    sys.exit(main())

from agspec.adapters.vllm import main

raise SystemExit(main())

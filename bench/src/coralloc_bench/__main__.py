"""`python -m coralloc_bench` is the `coralloc-bench` command."""

from coralloc_bench.cli import main

raise SystemExit(main())

"""`python -m ops`: see ops/cli.py."""

from ops.cli import main

raise SystemExit(main())

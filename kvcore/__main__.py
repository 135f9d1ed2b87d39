"""`python -m kvcore ...` is the `kvcore` command."""

from .cli import main

raise SystemExit(main())

"""python -m vllmwatch."""

from vllmwatch.cli import main

raise SystemExit(main())

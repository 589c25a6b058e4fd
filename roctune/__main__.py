"""`python -m roctune` runs the CLI."""
from roctune.cli import main

raise SystemExit(main())

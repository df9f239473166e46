"""``python -m azure_functions_db`` runs the ``afdb`` command line."""

from azure_functions_db.cli import main

raise SystemExit(main())

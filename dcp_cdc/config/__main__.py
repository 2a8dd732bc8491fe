"""``python -m dcp_cdc.config --check FILE``: validate a file and print it with every default."""

from __future__ import annotations

from dcp_cdc.config.loader import main

if __name__ == "__main__":
    raise SystemExit(main())

"""`python -m rig_mcp`: the MCP server (stdio by default)."""

import sys

from rig_mcp.server import main

sys.exit(main())

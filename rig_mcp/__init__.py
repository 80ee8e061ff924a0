"""An MCP server over the rig inventory: it drives the project's playbooks with ansible-runner."""

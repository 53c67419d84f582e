"""``jupyter agent``: the terminal command over the agent routes (server discovery so far)."""

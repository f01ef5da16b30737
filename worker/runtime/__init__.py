"""Pipeline runtime: coordinator, stage process host, transport, routing."""

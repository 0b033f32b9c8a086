"""Multi-device and multi-host: the mesh, the layouts, the start-up handshake."""

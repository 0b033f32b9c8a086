"""Cost and speed: FLOPs, throughput and MFU, hardware peaks, the shape advisor, ahead-of-time programs."""

"""Cost, speed and the plan: FLOPs, throughput and MFU, hardware peaks, every setting derived
from a config and the devices (`plan`), the shape advisor, ahead-of-time programs."""

"""codec="auto": the per-bucket path and codec chosen from measured costs."""

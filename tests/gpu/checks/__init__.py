"""What the suite compares and how far apart it allows: the load, one-step and quantized checks a rank runs,
routing, the verdict functions, the bounds (tolerances) and fake quantization."""

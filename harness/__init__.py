"""harness: multi-GPU regression harness for expert-parallel and FSDP2 loading."""

__version__ = "0.1.0"

"""The tensorboard tracker: plugin (torch-free) and its OLMo-core callback."""

"""The mlflow tracker: plugin (torch-free) and its OLMo-core callback."""

"""First-party trackers: where a run's metrics, resolved config and plan are recorded."""

"""What the gateway tells its operators: Prometheus metrics and JSON logs."""

"""What the dispatcher and the workers show about themselves: the status page, its HTTP
server and the Prometheus metrics. Loaded only by servers, never by a training process."""

"""Serving metrics: the catalogue, the HTTP server, the node and rank exporters, targets, self-monitoring."""

"""Device sources: what each vendor's tool or driver reports, parsed into base-unit readings."""

"""Tools for testing distributed jobs as users run them: ``cluster`` builds several nodes on one machine."""

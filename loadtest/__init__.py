"""Load tests (locust) against a running rtserve."""

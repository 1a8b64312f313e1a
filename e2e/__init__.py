"""End-to-end tests against a real cluster; a package so that its conftest is `e2e.conftest`."""

# Shared fixtures: the data fixtures build the demo digits and tiny image sets once per session.
pytest_plugins = ["tests.data_fixtures"]

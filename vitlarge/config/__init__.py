"""The run's configuration: the schema (`schema`), loading recipes with overrides and validation (`load`), and the ``train.phases`` list (`phase_list`)."""

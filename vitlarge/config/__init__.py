"""The run's configuration: the schema (`schema`); loading a recipe with overrides and validating it (`load`), the
overrides (`overrides`; read from files by `override_files`; typed by `coerce`), the profile window
(`profile_window`), the trackers' checks (`trackers`); and the ``train.phases`` list (`phase_list`)."""
